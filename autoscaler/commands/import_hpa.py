"""``autoscaler import-hpa``: the GPUScalingPolicy equivalent to a HorizontalPodAutoscaler, from a file or the cluster.

Prints the policy as YAML on standard output, with what has no equivalent and which metric kind was taken from which
metric name as comments at the top (and on standard error), so that ``autoscaler import-hpa hpa.yaml > policy.yaml``
is reviewable as it stands. The input is read as every YAML input of the project (``autoscaler.yaml_input``): UTF-8,
safely, a key given twice refused.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any, cast

import yaml

from autoscaler.core.model import MetricKind
from autoscaler.yaml_input import YamlProblem, decode_utf8, load_yaml_all

EXIT_OK = 0
EXIT_READ_FAILED = 1
EXIT_INVALID = 2
#: Largest manifest file read: ``kubectl get hpa -A -o yaml`` of a large cluster is a few MB.
MAX_INPUT_BYTES = 64 * 1024 * 1024


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "import-hpa",
        help="write the GPUScalingPolicy equivalent to a HorizontalPodAutoscaler (file or live)",
        description=textwrap.dedent(
            """\
            Translate HorizontalPodAutoscalers (autoscaling/v2, v2beta2 or v1) into GPUScalingPolicies: min/max
            replicas, the metric, the behavior block (windows, rate policies, select policy, tolerance) or its
            absence (hpaWithoutBehavior: true). Fields without an equivalent are listed as comments, and so is the
            metric kind taken from a metric's name. An autoscaling/v1 object with its v2 metrics or behavior in
            annotations is refused: export it as v2 (kubectl get hpa.v2.autoscaling NAME -n NS -o yaml). Give a
            file (YAML or JSON, several documents allowed; - for standard input), or --namespace and --name to read
            a live HPA. To hand a Deployment over from its HPA, set spec.adoptHpa in the policy (see the README).
            """
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=textwrap.dedent(
            """\
            several HPAs (YAML documents, or a kind: List): each importable one is written; each one that is not is
            reported on standard error as "document N: FIELD: problem" (nothing written for it), and the exit code
            is then 2.

            exit codes: 0 all written; 1 the live HPA could not be read; 2 the input (or one of its HPAs) is not an
            importable HPA (the field is named)
            """
        ),
    )
    parser.add_argument("file", nargs="?", metavar="FILE", help="HPA manifest(s), YAML or JSON; - for stdin")
    parser.add_argument("-n", "--namespace", metavar="NS", help="namespace of a live HPA (not with a FILE)")
    parser.add_argument("--name", metavar="NAME", help="name of a live HPA (with --namespace)")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        metavar="FILE",
        help="kubeconfig, for a live HPA (default: $KUBECONFIG or ~/.kube/config)",
    )
    parser.add_argument(
        "--context", metavar="NAME", help="kubeconfig context, for a live HPA (default: its current-context)"
    )
    parser.add_argument(
        "--metric",
        metavar="TYPE=TARGET",
        help="scale on this metric instead (e.g. gpu_utilization=70) - needed when the HPA scales on CPU or memory; "
        f"TYPE is one of {', '.join(k.value for k in MetricKind)}",
    )
    parser.add_argument("--adopt", action="store_true", help="set spec.adoptHpa to the HPA's name in the output")
    parser.add_argument(
        "-o", "--output", choices=("yaml", "json"), default="yaml", help="the policy as YAML (default) or JSON"
    )
    parser.set_defaults(func=main)


def _metric_override(text: str | None) -> tuple[MetricKind, float] | None:
    if text is None:
        return None
    kind, sep, target = text.partition("=")
    try:
        value = float(target)
        metric = MetricKind(kind.strip())
    except ValueError:
        raise ValueError(
            f"--metric: {text!r} is not TYPE=TARGET with TYPE one of "
            f"{', '.join(k.value for k in MetricKind)} and TARGET a number"
        ) from None
    if not sep or not (value > 0 and value != float("inf")):
        raise ValueError(f"--metric: {text!r}: the target must be a positive number")
    return metric, value


def _one_line(text: str) -> str:
    """``text`` with every line break and other control character escaped (``\\n``): what goes into a ``#`` comment
    (or a line of standard error) stays one line, whatever an HPA's names hold."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _read_text(name: str) -> str:
    shown = _one_line(name)
    if name == "-":
        stream = getattr(sys.stdin, "buffer", None)
        raw = stream.read(MAX_INPUT_BYTES + 1) if stream is not None else sys.stdin.read(MAX_INPUT_BYTES + 1).encode()
    else:
        path = Path(name)
        try:
            with path.open("rb") as handle:
                raw = handle.read(MAX_INPUT_BYTES + 1)
        except IsADirectoryError:
            raise ValueError(f"{shown}: is a directory, not an HPA manifest") from None
        except OSError as exc:
            raise ValueError(f"{shown}: {exc.strerror or exc}") from None
        except ValueError as exc:  # e.g. a NUL in the name
            raise ValueError(f"{name!r}: {exc}") from None
    if len(raw) > MAX_INPUT_BYTES:
        raise ValueError(f"{shown}: larger than {MAX_INPUT_BYTES // (1024 * 1024)} MiB: not an HPA manifest")
    try:
        return decode_utf8(raw)
    except YamlProblem as problem:
        raise ValueError(f"{shown}: {problem}") from None


def _read_documents(args: argparse.Namespace) -> list[tuple[str, Any]]:
    """The objects in the file, each with its place ("document 2", "document 1 items[3]") for messages."""
    text = _read_text(args.file)
    try:
        # as every YAML input of the project: safely, and a key given twice is an error (not: the last one wins)
        docs = [d for d in load_yaml_all(text) if d is not None]
    except YamlProblem as problem:
        at = f" (line {problem.line}, column {problem.column})" if problem.line is not None else ""
        raise ValueError(f"{_one_line(args.file)}: not valid YAML or JSON: {_one_line(str(problem))}{at}") from None
    out: list[tuple[str, Any]] = []
    for number, doc in enumerate(docs, start=1):
        if isinstance(doc, dict) and doc.get("kind") == "List":  # kubectl get hpa -o yaml
            items = doc.get("items")
            if items is None:
                continue
            if not isinstance(items, list):
                raise ValueError(f"{_one_line(args.file)}: document {number}: items: a List's items must be a list")
            out.extend((f"document {number} items[{index}]", item) for index, item in enumerate(items))
        else:
            out.append((f"document {number}", doc))
    return out


def _read_live(args: argparse.Namespace) -> dict[str, Any]:
    from kubernetes import client

    from autoscaler.adapters.kubernetes.config import load_api_client

    api = load_api_client("kubeconfig", args.kubeconfig, context=args.context)
    try:
        response = client.AutoscalingV2Api(api).read_namespaced_horizontal_pod_autoscaler(
            args.name, args.namespace, _preload_content=False, _request_timeout=10
        )
        # _preload_content=False: the raw HTTP response (its body as sent), not the generated model
        obj: dict[str, Any] = json.loads(cast(Any, response).data)
    finally:
        api.close()  # type: ignore[no-untyped-call]
    obj.setdefault("apiVersion", "autoscaling/v2")
    obj.setdefault("kind", "HorizontalPodAutoscaler")
    return obj


def main(args: argparse.Namespace) -> int:
    from autoscaler.adapters.kubernetes.hpa import HpaImportError, import_hpa

    try:
        override = _metric_override(args.metric)
    except ValueError as exc:
        print(f"autoscaler import-hpa: {exc}", file=sys.stderr)
        return EXIT_INVALID
    if (args.file is None) == (args.name is None):
        print("autoscaler import-hpa: give a FILE, or --namespace and --name of a live HPA", file=sys.stderr)
        return EXIT_INVALID
    if args.file is not None:
        # Read only for a live HPA: silently dropped with a FILE, -n prod wrote the policy for the file's namespace
        # (or default), where kubectl apply then created it.
        given = (("-n/--namespace", args.namespace), ("--kubeconfig", args.kubeconfig), ("--context", args.context))
        live_only = [option for option, value in given if value is not None]
        if live_only:
            print(
                f"autoscaler import-hpa: {', '.join(live_only)} apply only to a live HPA (--name), not to a FILE: the"
                " policy takes the HPA's metadata.namespace (default: default); set it in the file (or in the"
                " output) to import it into another namespace",
                file=sys.stderr,
            )
            return EXIT_INVALID
    if args.file is not None:
        try:
            documents = _read_documents(args)
        except ValueError as exc:
            print(f"autoscaler import-hpa: {exc}", file=sys.stderr)
            return EXIT_INVALID
    else:
        if not args.namespace:
            print("autoscaler import-hpa: --name needs --namespace", file=sys.stderr)
            return EXIT_INVALID
        try:
            documents = [("", _read_live(args))]
        except Exception as exc:  # the client raises many types; all mean "could not read"
            status = getattr(exc, "status", None)
            what = f"HTTP {status}" if status else type(exc).__name__
            print(
                f"autoscaler import-hpa: could not read HPA {args.namespace}/{args.name}: {what}: "
                f"{getattr(exc, 'reason', None) or exc}",
                file=sys.stderr,
            )
            return EXIT_READ_FAILED
    if not documents:
        print(f"autoscaler import-hpa: {_one_line(args.file)}: no HPA in it", file=sys.stderr)
        return EXIT_INVALID
    outputs = []
    status = EXIT_OK
    for label, doc in documents:
        where = "" if len(documents) == 1 else f"{label}: "
        try:
            imported = import_hpa(doc, override)
        except HpaImportError as exc:
            # The others are still written: one bad HPA in a cluster dump must not hide the rest.
            print(f"autoscaler import-hpa: {where}{_one_line(str(exc))}", file=sys.stderr)
            status = EXIT_INVALID
            continue
        if args.adopt:
            imported.manifest["spec"]["adoptHpa"] = imported.manifest["metadata"]["name"]
        outputs.append(imported)
        meta = imported.manifest["metadata"]
        for note in [*imported.inferred, *imported.notes]:
            print(f"autoscaler import-hpa: {meta['namespace']}/{meta['name']}: {_one_line(note)}", file=sys.stderr)
    if not outputs:
        return status
    if len(documents) > 1 and status != EXIT_OK:
        print(
            f"autoscaler import-hpa: {len(outputs)} of {len(documents)} HPAs written; the others are not importable",
            file=sys.stderr,
        )
    if args.output == "json":
        docs = [o.manifest for o in outputs]
        # Several HPAs in give a List out, even when some of them could not be imported.
        single = len(documents) == 1
        print(json.dumps(docs[0] if single else {"apiVersion": "v1", "kind": "List", "items": docs}, indent=2))
        return status
    parts = []
    for imported in outputs:
        meta = imported.manifest["metadata"]
        # A comment is one line: a line break in it would make the rest of the line YAML (keys of the policy).
        header = [
            f"# Imported from HorizontalPodAutoscaler {_one_line(meta['namespace'])}/{_one_line(meta['name'])} by "
            "autoscaler import-hpa."
        ]
        header += [f"# inferred: {_one_line(note)}" for note in imported.inferred]
        header += [f"# no equivalent: {_one_line(note)}" for note in imported.notes]
        parts.append("\n".join(header) + "\n" + yaml.safe_dump(imported.manifest, sort_keys=False))
    sys.stdout.write("---\n".join(parts))
    return status
