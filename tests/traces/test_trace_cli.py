"""``autoscaler trace convert`` / ``autoscaler trace info``."""

from __future__ import annotations

import argparse
import gzip
import re
from pathlib import Path

import pytest

from autoscaler.commands import trace as trace_command
from autoscaler.traces import load_request_log, load_trace


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
    assert run(["trace", "convert", "nab", str(bad), "-o", str(out)]) == 1
    assert f"error: {bad}:3:2: value: 'lots' is not a number" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("value", ["0", "-5", "abc", "inf"])
def test_step_must_be_a_positive_number(value: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        run(["trace", "convert", "servegen", "x", "-o", "y", "--step", value])
    assert caught.value.code == 2
    assert "--step" in capsys.readouterr().err


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
    assert run(["trace", "info", str(good), str(log), str(bad)]) == 1
    captured = capsys.readouterr()
    lines = captured.out.strip().splitlines()
    assert (
        lines[0]
        == f"{good}: rate series, 2 rows, step 60 s, span 2 min from 1970-01-01T00:00:00Z, mean 2 req/s, peak 3 req/s"
    )
    assert lines[1].startswith(f"{log}: request log, 3 rows, no step")
    assert f"{bad}:3:2: rate: '-3' is negative" in captured.err


def test_registered_in_the_top_level_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from autoscaler.cli import main

    good = write(tmp_path / "r.csv", "timestamp,rate\n0,1\n60,3\n")
    assert main(["trace", "info", str(good)]) == 0
    assert "rate series" in capsys.readouterr().out
