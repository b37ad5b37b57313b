"""Run every benchmark in bench/ and write one markdown table.

    .venv/bin/python bench/run_all.py [--quick] [--out bench/results.md] [NAME ...]

Contract for a benchmark: a file `bench/<name>.py` (names starting with `_` are helpers), run as `python bench/<name>.py [--quick]`
(`--quick`: reduced sizes, for development), that prints its results as table rows

    | benchmark | weightkeeper | reference tool | ratio |

one line each, starting with `| ` (anything else it prints is shown but not collected). The
reference tool is measured in the same run; the ratio says which way is better in its own words
(for example `0.93x hf's speed`). run_all.py runs them one after another, in name order, prints
their output, and writes the collected rows under a header with the machine they ran on.
"""

from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
HEADER = "| benchmark | weightkeeper | reference tool | ratio |\n|---|---|---|---|"


def machine() -> str:
    """nproc, CPU model, memory (free -h), kernel: enough to compare figures across machines."""
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor())
    memory = subprocess.run(["free", "-h"], capture_output=True, text=True).stdout.splitlines()[1].split()[1]
    nproc = subprocess.run(["nproc"], capture_output=True, text=True).stdout.strip()
    return f"{nproc} CPUs ({cpu}), {memory} RAM, Linux {platform.release()}, Python {platform.python_version()}"


def run_benchmark(script: Path, quick: bool) -> tuple[list[str], str | None]:
    """The table rows a benchmark printed, and a problem if it failed."""
    print(f"== {script.name}", flush=True)
    proc = subprocess.Popen([sys.executable, str(script), *(["--quick"] if quick else [])], cwd=BENCH.parent,
                            stdout=subprocess.PIPE, text=True)
    rows = []
    for line in proc.stdout:
        print(line, end="", flush=True)
        if line.startswith("| "):
            rows.append(line.rstrip("\n"))
    code = proc.wait()
    return rows, None if code == 0 else f"{script.name} exited with {code}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="reduced sizes (development)")
    parser.add_argument("--out", type=Path, default=BENCH / "results.md")
    parser.add_argument("names", nargs="*", help="only these benchmarks (e.g. download scale); default: all")
    args = parser.parse_args()
    scripts = sorted(p for p in BENCH.glob("*.py") if p.name != Path(__file__).name and not p.name.startswith("_")
                     and (not args.names or p.stem in args.names))
    if unknown := set(args.names) - {p.stem for p in scripts}:
        parser.error(f"no benchmark named {', '.join(sorted(unknown))} in {BENCH}")
    rows, problems = [], []
    started = time.strftime("%Y-%m-%d %H:%M")
    for script in scripts:
        found, problem = run_benchmark(script, args.quick)
        rows += found
        problems += [problem] if problem else []
    table = "\n".join([HEADER, *rows])
    notes = "".join(f"\n\nFailed: {p}" for p in problems)
    args.out.write_text(f"Measured {started} on {machine()}{' (--quick sizes)' if args.quick else ''}:\n\n"
                        f"{table}{notes}\n")
    print(f"\n{args.out.read_text()}")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
