"""``autoscaler trace convert`` / ``autoscaler trace info``."""

from __future__ import annotations

import argparse
import gzip
import re
import warnings
from pathlib import Path

import pytest

from autoscaler.commands import trace as trace_command
from autoscaler.traces import load_request_log, load_trace
from autoscaler.traces.formats import summarise


def run(argv: list[str]) -> int:
    # Only this command's parser: these tests must not depend on the other commands importing cleanly.
    parser = argparse.ArgumentParser(prog="autoscaler")
    trace_command.register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(text.encode()))
    else:
        path.write_text(text)
    return path


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.6805900,374,44\n2023-11-16 18:16:50.9951690,3,1\n"
SERVEGEN = "0,2.0,1.0,Gamma,1.0,0.5\n600,1.0,1.0,Gamma,1.0,1.0\n"
NAB = "timestamp,value\n2014-07-01 00:00:00,10\n2014-07-01 00:05:00,20\n2014-07-01 00:10:00,30\n"
FUNCTIONS = "HashFunction,HashOwner,HashApp,1_minute,2_minute,3_minute\nabc,o,a,60,120,30\nabd,o,a,0,60,0\n"


def test_convert_azure_llm_prints_one_line_per_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source = write(tmp_path / "in" / "conv.csv", AZURE)
    out = tmp_path / "out" / "conv.csv.gz"
    assert run(["trace", "convert", "azure-llm", str(source), "--output", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert len(printed) == 1
    assert printed[0].startswith(f"{out}: 2 rows, no step")
    assert "span 64.3146 s from 2023-11-16T18:15:46Z" in printed[0] and "req/s" in printed[0]
    log = load_request_log(out)
    assert len(log) == 2 and log.input_tokens is not None and log.input_tokens.tolist() == [374, 3]


def test_convert_into_a_directory_writes_one_file_per_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    a = write(tmp_path / "a.csv", AZURE)
    b = write(tmp_path / "b.csv.gz", AZURE)
    out = tmp_path / "out"
    assert run(["trace", "convert", "azure-llm", str(a), str(b), "--output", f"{out}/"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["a.csv.gz", "b.csv.gz"]
    assert len(capsys.readouterr().out.strip().splitlines()) == 2


def test_convert_servegen_with_step_seed_start_and_decimals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "m"
    write(folder / "chunk-0-trace.csv", SERVEGEN)
    out = tmp_path / "sg.csv"
    argv = ["trace", "convert", "servegen", str(folder), "-o", str(out)]
    argv += ["--step", "30", "--seed", "4", "--start", "2024-01-01T00:00:00", "--decimals", "2"]
    assert run(argv) == 0
    series = load_trace(out)
    assert (series.start, series.step_s, len(series)) == (1_704_067_200.0, 30.0, 40)
    assert all(re.fullmatch(r"\d+(\.\d{1,2})?", line.split(",")[1]) for line in out.read_text().splitlines()[1:])
    assert ", seed 4" in capsys.readouterr().out


def test_convert_nab_and_azure_functions(tmp_path: Path) -> None:
    nab = write(tmp_path / "nab.csv", NAB)
    assert run(["trace", "convert", "nab", str(nab), "-o", str(tmp_path / "n.csv"), "--scale", "0.1"]) == 0
    assert load_trace(tmp_path / "n.csv").rates.tolist() == pytest.approx([1.0, 2.0, 3.0])
    fn = write(tmp_path / "inv.csv", FUNCTIONS)
    out = tmp_path / "f.csv"
    assert run(["trace", "convert", "azure-functions", str(fn), "-o", str(out), "--function", "ABC"]) == 0
    assert load_trace(out).rates.tolist() == [1.0, 2.0, 0.5]
    assert run(["trace", "convert", "azure-functions", str(fn), "-o", str(out), "--step", "120"]) == 0
    assert load_trace(out).rates.tolist() == [2.0, 0.5]  # (60 + 180) / 120 s, then the 60 s tail alone


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["azure-llm", "IN", "-o", "OUT", "--step", "60"], "--step does not apply to azure-llm"),
        (["nab", "IN", "-o", "OUT", "--seed", "1"], "--seed does not apply to nab (only to servegen)"),
        (["nab", "IN", "-o", "OUT", "--start", "0"], "--start does not apply to nab"),
        (["servegen", "IN", "-o", "OUT", "--function", "ab"], "--function does not apply to servegen"),
        (["azure-llm", "IN", "-o", "OUT", "--scale", "2"], "--scale does not apply to azure-llm"),
        (["servegen", "IN", "-o", "OUT", "--start", "tomorrow"], "--start: 'tomorrow' is neither Unix seconds"),
        (["nab", "IN", "IN2", "-o", "OUT.csv"], "nab takes one INPUT per output"),
        (["servegen", "IN", "-o", "OUT", "--start", "1e300"], "--start: '1e300' is outside 1970-01-01..9999-12-31"),
        (["servegen", "IN", "-o", "OUT", "--start", "-5"], "--start: '-5' is outside 1970-01-01..9999-12-31"),
    ],
)
def test_convert_rejects_options_that_do_not_apply(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert run(["trace", "convert", *[str(tmp_path / a) if a.isupper() else a for a in argv]]) == 2
    assert message in capsys.readouterr().err


def test_convert_reports_bad_files_with_line_and_column(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = write(tmp_path / "nab.csv", "timestamp,value\n2014-07-01 00:00:00,10\n2014-07-01 00:05:00,lots\n")
    out = tmp_path / "out.csv"
    assert run(["trace", "convert", "nab", str(bad), "-o", str(out)]) == 2
    assert f"error: {bad}:3:2: value: 'lots' is not a number" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-5", "abc", "inf"])
def test_step_must_be_a_positive_number(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        run(["trace", "convert", "servegen", "x", "-o", "y", "--step", value])
    assert caught.value.code == 2
    assert "--step" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("--decimals", "-1", "argument --decimals: '-1' must be a whole number from 0 to 15"),
        ("--decimals", "16", "argument --decimals: '16' must be a whole number from 0 to 15"),
        ("--decimals", "400", "argument --decimals: '400' must be a whole number from 0 to 15"),
        ("--decimals", "2.5", "argument --decimals: '2.5' is not a whole number"),
        ("--seed", "-1", "argument --seed: '-1' must be 0 or more"),
    ],
)
def test_convert_options_out_of_range_are_usage_errors_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], option: str, value: str, message: str
) -> None:
    folder = tmp_path / "m"
    write(folder / "chunk-0-trace.csv", SERVEGEN)
    out = tmp_path / "out.csv"
    with pytest.raises(SystemExit) as caught:
        run(["trace", "convert", "servegen", str(folder), "-o", str(out), option, value])
    assert caught.value.code == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("decimals", ["0", "15"])
def test_convert_decimals_at_the_ends_of_the_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], decimals: str
) -> None:
    nab = write(tmp_path / "nab.csv", NAB)
    out = tmp_path / "n.csv"
    assert (
        run(["trace", "convert", "nab", str(nab), "-o", str(out), "--scale", "0.0123456789", "--decimals", decimals])
        == 0
    )
    written = load_trace(out)
    expected = [round(v * 0.0123456789, int(decimals)) for v in (10, 20, 30)]
    assert written.rates.tolist() == pytest.approx(expected, abs=1e-15)
    # The printed summary is that of the file as written (rounded).
    assert capsys.readouterr().out.startswith(f"{out}: {summarise(written)}")


# Conversions that fail on valid-looking input: exit 1, an error naming the file (and row), no traceback or
# RuntimeWarning, and the output left as it was (here: an older file that must survive).
CONVERT_FAILURES: list[tuple[str, str, str, dict[str, str], list[str], str]] = [
    # (id, format, input name, {file: content}, extra options, message)
    (
        "nab step 1 ns",
        "nab",
        "nab.csv",
        {"nab.csv": NAB},
        ["--step", "1e-9"],
        "nab.csv: --step: resampling 15 min to a step of 1e-09 s makes 900,000,000,000 bins, more than the maximum of"
        " 20,000,000",
    ),
    (
        "azure-functions step 1e-300",
        "azure-functions",
        "inv.csv",
        {"inv.csv": FUNCTIONS},
        ["--step", "1e-300"],
        "inv.csv: --step: resampling 3 min to a step of 1e-300 s makes 1.8e+302 bins",
    ),
    (
        "servegen step 1 ns",
        "servegen",
        "m",
        {"m/chunk-0-trace.csv": SERVEGEN},
        ["--step", "1e-9"],
        "2 windows of 600 s at a step of 1e-09 s make 1,200,000,000,000 bins, more than the maximum of 20,000,000",
    ),
    (
        "servegen ends after 9999",
        "servegen",
        "m",
        {"m/chunk-0-trace.csv": SERVEGEN},
        ["--start", "253402300000"],
        "m: the converted series runs from Unix second 253402300000 to 253402301140, outside 1970-01-01..9999-12-31",
    ),
    (
        "servegen windows too short for the step",
        "servegen",
        "m",
        {"m/chunk-0-trace.csv": "0,2.0,1.0,Gamma,1.0,0.5\n1,1.0,1.0,Gamma,1.0,1.0\n"},
        [],
        "m: the converted series has 1 bin of 60 s, but a rate series file needs at least 2 rows",
    ),
    (
        "servegen tiny Gamma shape",
        "servegen",
        "m",
        {"m/chunk-0-trace.csv": "0,2.0,1.0,Gamma,0.0001,0.5\n600,1.0,1.0,Gamma,1.0,1.0\n"},
        [],
        "chunk-0-trace.csv:1:5: dist_arg1 (shape): '0.0001' is below 0.001",
    ),
    (
        "nab scale overflows",
        "nab",
        "nab.csv",
        {"nab.csv": NAB},
        ["--scale", "1e307"],
        "nab.csv:4:2: value: '30' x scale 1e+307 is not a finite rate",
    ),
    (
        "azure-llm tokens beyond int64",
        "azure-llm",
        "a.csv",
        {"a.csv": AZURE + "2023-11-16 18:17:00,99999999999999999999999,1\n"},
        [],
        "a.csv:4:2: ContextTokens: '99999999999999999999999' is too large",
    ),
]


@pytest.mark.parametrize(
    ("fmt", "source", "files", "options", "message"),
    [c[1:] for c in CONVERT_FAILURES],
    ids=[c[0] for c in CONVERT_FAILURES],
)
def test_convert_failures_name_the_problem_and_leave_the_output_alone(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    fmt: str,
    source: str,
    files: dict[str, str],
    options: list[str],
    message: str,
) -> None:
    for name, content in files.items():
        write(tmp_path / name, content)
    out = write(tmp_path / "out.csv", "timestamp,rate\n0,1\n60,1\n")  # a previous conversion
    before = out.read_bytes()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        code = run(["trace", "convert", fmt, str(tmp_path / source), "-o", str(out), *options])
    err = capsys.readouterr().err
    assert code == 2, err
    assert message in err, err
    assert out.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no temporary file left


def test_convert_help_explains_every_option_with_its_unit(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        run(["trace", "convert", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for option in ("--output", "--step", "--seed", "--start", "--function", "--scale", "--decimals"):
        assert option in text
    for fmt in ("azure-llm", "servegen", "azure-functions", "nab"):
        assert f"{fmt}:" in text
    assert "in seconds" in text and "Unix seconds or ISO 8601" in text and "(req/s)" in text


def test_info_checks_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = write(tmp_path / "r.csv", "timestamp,rate\n0,1\n60,3\n")
    log = write(tmp_path / "l.csv", "timestamp\n0\n1\n70\n")
    bad = write(tmp_path / "b.csv", "timestamp,rate\n0,1\n60,-3\n")
    assert run(["trace", "info", str(good), str(log), str(bad)]) == 2
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert (
        lines[0]
        == f"{good}: rate series, 2 rows, step 60 s, span 2 min from 1970-01-01T00:00:00Z, mean 2 req/s, peak 3 req/s"
    )
    assert lines[1].startswith(f"{log}: request log, 3 rows, no step")
    assert f"{bad}:3:2: rate: '-3' is negative" in captured.err


# `trace info` on valid-looking files the reviewer found crashing (OverflowError, a 248 GiB or 1.31 TiB allocation,
# an OOM kill), or silently wrong (a negative token count, an error without file or line): each is one error line.
INFO_FAILURES: list[tuple[str, str, list[str], str]] = [
    # (id, file content, options, message after "error: FILE")
    ("timestamps 1e300", "timestamp,rate\n1e300,1\n2e300,2\n", [], ":2:1: timestamp: '1e300' is outside 1970-01-01"),
    ("log -1e12 to 1e12", "timestamp\n-1e12\n1e12\n", [], ":2:1: timestamp: '-1e12' is outside 1970-01-01"),
    ("log 1e300 then 1", "timestamp\n1e300\n1\n", [], ":2:1: timestamp: '1e300' is outside 1970-01-01"),
    (
        "log over 63 years",
        "timestamp\n0\n2e9\n",
        [],
        ":3:1: timestamp: '2e9' is 63.38 years after the earliest request ('0', line 2): binned at 60 s that is"
        " 33,333,334 bins, more than the maximum of 20,000,000",
    ),
    (
        "rate series at --step 1e-9",
        "timestamp,rate\n0,1\n60,2\n120,3\n",
        ["--step", "1e-9"],
        ": resampling 3 min to a step of 1e-09 s makes 180,000,000,000 bins, more than the maximum of 20,000,000",
    ),
    (
        "request log at --step 1e-9",
        "timestamp\n0\n60\n120\n",
        ["--step", "1e-9"],
        ":4:1: timestamp: '120' is 2 min after the earliest request ('0', line 2): binned at 1e-09 s that is"
        " 120,000,000,000 bins, more than the maximum of 20,000,000",
    ),
    (
        "tokens beyond int64",
        "timestamp,input_tokens,output_tokens\n1,99999999999999999999999,3\n",
        [],
        ":2:2: input_tokens: '99999999999999999999999' is too large (at most 9,007,199,254,740,991)",
    ),
]


@pytest.mark.parametrize(
    ("content", "options", "message"), [c[1:] for c in INFO_FAILURES], ids=[c[0] for c in INFO_FAILURES]
)
def test_info_reports_bad_files_as_one_error_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str, options: list[str], message: str
) -> None:
    path = write(tmp_path / "t.csv", content)
    others = [] if options else [str(write(tmp_path / "good.csv", "timestamp,rate\n0,1\n60,3\n"))]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no numpy RuntimeWarning
        code = run(["trace", "info", str(path), *others, *options])
    captured = capsys.readouterr()
    assert code == 2
    assert captured.err.startswith(f"autoscaler trace info: error: {path}{message}"), captured.err
    assert captured.err.count("\n") == 1, captured.err
    if others:
        assert captured.out.startswith(f"{others[0]}: rate series")  # the other file is still checked


def test_info_on_a_long_request_log_says_the_peak_was_not_computed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # 100 years is fine binned at a day, but its 60 s summary would need 53 M bins: skipped, not allocated.
    path = write(tmp_path / "log.csv", "timestamp\n0\n3155760000\n")
    assert run(["trace", "info", str(path), "--step", "86400"]) == 0
    line = capsys.readouterr().out
    assert "peak not computed (more than 20,000,000 bins of 60 s)" in line and "binned: 36526 rows, step 24 h" in line


def test_registered_in_the_top_level_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoscaler.cli import main

    good = write(tmp_path / "r.csv", "timestamp,rate\n0,1\n60,3\n")
    assert main(["trace", "info", str(good)]) == 0
    assert "rate series" in capsys.readouterr().out


# ---- review fixes: nothing lost, bounded memory, exit 2 ---------------------------------------------------------


def test_directory_mode_refuses_two_inputs_of_one_name_and_an_output_that_is_an_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two inputs named data.csv wrote one output (the second silently won); -o the input's own folder replaced the
    input with the converted file."""
    for sub, rate in (("a", 1), ("b", 999)):
        (tmp_path / sub).mkdir()
        rows = "".join(f"2024-01-01 00:{m:02d}:00,{rate}\n" for m in range(10))
        (tmp_path / sub / "data.csv").write_text("timestamp,value\n" + rows)
    out = tmp_path / "out"
    out.mkdir()
    inputs = [str(tmp_path / "a" / "data.csv"), str(tmp_path / "b" / "data.csv")]
    code = run(["trace", "convert", "nab", *inputs, "-o", f"{out}/"])
    assert code == 2 and "would both be written" in capsys.readouterr().err
    assert list(out.iterdir()) == []
    source = tmp_path / "same"
    source.mkdir()
    original = "timestamp,value\n" + "".join(f"2024-01-01 00:{m:02d}:00,5\n" for m in range(10))
    (source / "data.csv.gz").write_bytes(gzip.compress(original.encode()))
    code = run(["trace", "convert", "nab", str(source / "data.csv.gz"), "-o", f"{source}/"])
    assert code == 2 and "is the input" in capsys.readouterr().err
    assert gzip.decompress((source / "data.csv.gz").read_bytes()).decode() == original


def test_a_gzip_expanding_beyond_the_limit_is_a_clear_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import autoscaler.traces.formats as formats

    monkeypatch.setattr(formats, "MAX_DECOMPRESSED_BYTES", 1 << 20)
    bomb = tmp_path / "bomb.csv.gz"
    bomb.write_bytes(gzip.compress(b"timestamp,rate\n" + b"\n" * (4 << 20)))
    assert run(["trace", "info", str(bomb)]) == 2
    assert "expands to more than" in capsys.readouterr().err


def test_a_servegen_client_given_twice_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A chunk next to its gunzipped copy, or one file named twice, summed its clients twice: the demand doubled."""
    chunks = tmp_path / "m"
    chunks.mkdir()
    text = "0,10,1,Gamma,1,0.1\n600,10,1,Gamma,1,0.1\n"
    (chunks / "chunk-0-trace.csv.gz").write_bytes(gzip.compress(text.encode()))
    assert run(["trace", "convert", "servegen", str(chunks), "-o", str(tmp_path / "once.csv")]) == 0
    capsys.readouterr()
    one = str(chunks / "chunk-0-trace.csv.gz")
    assert run(["trace", "convert", "servegen", one, one, "-o", str(tmp_path / "twice.csv")]) == 2
    assert "given twice" in capsys.readouterr().err
    (chunks / "chunk-0-trace.csv").write_text(text)
    assert run(["trace", "convert", "servegen", str(chunks), "-o", str(tmp_path / "copy.csv")]) == 2
    assert "chunk 0 is also" in capsys.readouterr().err


def test_a_bad_byte_after_a_byte_order_mark_is_named_where_it_is(tmp_path: Path) -> None:
    """The utf-8-sig decoder counts from after the mark: the error named the mark's last byte, 3 columns early."""
    from autoscaler.traces.formats import TraceFormatError, read_text
    from autoscaler.yaml_input import YamlProblem, decode_utf8

    raw = b"\xef\xbb\xbftimestamp,rate\n0,1\n60,\xff\n"
    path = tmp_path / "bom.csv"
    path.write_bytes(raw)
    with pytest.raises(TraceFormatError, match=r"0xff"):
        read_text(path)
    with pytest.raises(YamlProblem, match=r"byte 0xff at line 3, column 4"):
        decode_utf8(raw)
