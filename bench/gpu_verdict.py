"""Issue 11's GPU targets, read from the results of bench/gpu_issue11.sh: met, missed or not measured, with the figures.

Reads the step JSONs (a results.tgz, or the folder holding them) and checks each target the script's steps measure:

  syncs           patch closures: 0 syncs per model call (the sigma-read control row must show 1, or the count is
                  broken); in the first call only device-aware schedules may sync (they time their levels once)
  sampling_syncs  whole ComfyUI sampling runs: at most 1 sync per run above the unpatched model
  sd15_512        `balanced` >= 0.98x of the unpatched step at every batch
  sd15_1024       `balanced`'s match cost <= 10 % of the time it saves (match / (base - ours + match))
  cache512        step cache + tokens on the 512 face crop ("ours-both") >= 1.5x the unpatched U-Net sampling
  sdxl_1024       `balanced` >= 0.98x at every batch
  compiled        `balanced` under TorchCompileModel >= 0.98x of the compiled unpatched step
and reports what has no target (the face-crop plan's kept levels, the compiled step cache). Each timed table's
control row (the unpatched model timed again as if it were a variant) is printed beside it: how far two identical
runs drift on that device, the noise every ratio carries. Then the unet_step rows as Markdown tables for
docs/performance.md. A run on the CPU (QUICK=1) decides nothing: its timed checks say "cpu smoke" (the numbers
check the plumbing only).

    python bench/gpu_verdict.py RESULTS [--markdown] [--strict]

RESULTS: results.tgz or a folder with the JSONs (or an `r/` folder inside it). --strict: exit 1 if a target is
missed (not measured is not missed). Reads JSON only; no torch import.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
import tarfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

Results = dict[str, dict[str, Any]]

MIN_RATIO = 0.98
MAX_MATCH_SHARE = 0.10
MIN_CROP_SPEEDUP = 1.5
MAX_EXTRA_SYNCS = 1


@dataclass(frozen=True)
class Verdict:
    name: str
    target: str
    status: str  # "met", "MISSED", "not measured", "report", "cpu smoke" (a timed check on a CPU run)
    detail: str


def load_results(path: Path) -> Results:
    """{step name: its JSON} from results.tgz (members r/NAME.json) or a folder (NAME.json, or r/NAME.json)."""
    found: Results = {}
    if path.is_file():
        with tarfile.open(path, "r:gz") as tar:
            for member in tar.getmembers():
                if member.isfile() and member.name.endswith(".json"):
                    handle = tar.extractfile(member)
                    if handle is not None:
                        found[Path(member.name).stem] = json.load(io.TextIOWrapper(handle, encoding="utf-8"))
        return found
    folder = path / "r" if (path / "r").is_dir() else path
    for file in sorted(folder.glob("*.json")):
        found[file.stem] = json.loads(file.read_text(encoding="utf-8"))
    return found


def _rows(results: Results, step: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = results.get(step, {}).get("rows", [])
    return rows


def _fmt(values: list[str]) -> str:
    return "; ".join(values) if values else "no rows"


def _base_ms(rows: list[dict[str, Any]], row: dict[str, Any]) -> float | None:
    for r in rows:
        if r["variant"] == "baseline" and (r["model"], r["size"], r["batch"]) == (
            row["model"],
            row["size"],
            row["batch"],
        ):
            return float(r["step_ms"])
    return None


def _where(row: dict[str, Any]) -> str:
    return f"{row['model']} {row['size']} b{row['batch']}"


def check_syncs(results: Results) -> Verdict:
    target = "0 syncs per model call; control row 1; first call 0 unless calibrating"
    rows = _rows(results, "syncs")
    if not rows:
        note = results.get("syncs", {}).get("note", "no syncs.json")
        return Verdict("syncs", target, "not measured", note)
    bad, control = [], []
    for r in rows:
        later, first = r["syncs_per_model_call"], r["first_call_syncs"]
        if "control" in r["variant"]:
            control.append(f"{r['variant']}: {later:g} per call")
            if abs(later - 1.0) > 1e-9:
                bad.append(f"control {later:g} per call (count broken?)")
        elif later > 0 or (first > 0 and not r["calibrates"]):
            bad.append(f"{r['variant']}: {later:g} per call, {first} in the first")
    worst = max((r["syncs_per_model_call"] for r in rows if "control" not in r["variant"]), default=0.0)
    detail = f"{len(rows)} rows on {rows[0].get('device', '?')}, worst {worst:g} per model call; " + _fmt(control)
    return Verdict("syncs", target, "MISSED" if bad else "met", detail + ("; " + _fmt(bad) if bad else ""))


def check_sampling_syncs(results: Results) -> Verdict:
    target = f"<= +{MAX_EXTRA_SYNCS} sync per sampling run vs unpatched"
    data = results.get("sampling_syncs", {})
    rows = data.get("rows", [])
    device = str(data.get("device", ""))
    if not rows or device.startswith("cpu"):  # the CPU counts nothing (sync debug mode is CUDA only)
        return Verdict("sampling_syncs", target, "not measured", device or "no sampling_syncs.json")
    over = [f"{r['variant']} +{r['vs_unpatched']}" for r in rows if r["vs_unpatched"] > MAX_EXTRA_SYNCS]
    worst = max(rows, key=lambda r: r["vs_unpatched"])
    detail = f"{len(rows)} runs on {device}, most {worst['vs_unpatched']:+d} ({worst['variant']})"
    return Verdict("sampling_syncs", target, "MISSED" if over else "met", detail + ("; " + _fmt(over) if over else ""))


def check_ratio(results: Results, step: str, variant: str = "ours balanced") -> Verdict:
    target = f"`balanced` >= {MIN_RATIO}x at every batch"
    rows = _rows(results, step)
    ours = [r for r in rows if r["variant"] == variant]
    if not ours:
        return Verdict(step, target, "not measured", f"no '{variant}' rows in {step}.json")
    values = [f"{_where(r)} {r['vs_base']:.3f}x" for r in ours]
    controls = [f"{_where(r)} {r['vs_base']:.3f}x" for r in rows if r["variant"] == "baseline (control)"]
    detail = _fmt(values) + (f" (control: {_fmt(controls)})" if controls else "")
    return Verdict(step, target, "met" if all(r["vs_base"] >= MIN_RATIO for r in ours) else "MISSED", detail)


def match_share(rows: list[dict[str, Any]], row: dict[str, Any]) -> float | None:
    """match ms / (baseline - ours + match ms): the part of the attention time saved that the patches' own work eats;
    None without a match cost or a baseline, 0 when the closures cost nothing measurable (0 ms after the timer's floor,
    e.g. a device-aware schedule that kept no level: no saving for them to eat, and the step's noise decides nothing),
    inf when the closures cost something and nothing was saved."""
    base, match = _base_ms(rows, row), row.get("match_ms")
    if base is None or match is None:
        return None
    if float(match) <= 0.0:
        return 0.0
    gross = base - float(row["step_ms"]) + float(match)
    return float(match) / gross if gross > 0 else float("inf")


def check_match_cost(results: Results) -> Verdict:
    target = f"`balanced` match cost <= {MAX_MATCH_SHARE:.0%} of the time saved at SD1.5 1024"
    rows = _rows(results, "sd15_1024")
    ours = [r for r in rows if r["variant"] == "ours balanced"]
    shares = [(r, match_share(rows, r)) for r in ours]
    measured = [(r, s) for r, s in shares if s is not None]
    if not measured:
        return Verdict("sd15_1024", target, "not measured", "no match cost in sd15_1024.json")
    values = [
        f"{_where(r)} {s:.1%} ({r['match_ms']:.2f} ms per step; {r.get('device_aware') or 'static'})"
        for r, s in measured
    ]
    static = [(r, match_share(rows, r)) for r in rows if r["variant"] == "ours balanced-static"]
    also = [f"{_where(r)} {s:.1%}" for r, s in static if s is not None]
    detail = _fmt(values) + (f" (balanced-static: {_fmt(also)})" if also else "")
    ok = all(s <= MAX_MATCH_SHARE for _, s in measured)
    return Verdict("sd15_1024", target, "met" if ok else "MISSED", detail)


def _speed_rows(results: Results, step: str) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    data = results.get(step, {})
    return data.get("speed", []), data.get("settings", {})


def _rounds_note(rows: list[dict[str, Any]], settings: dict[str, Any]) -> str:
    """' (N of M rounds: ...)' when step_cache.py's JSON holds fewer rounds than asked (it rewrites the file after
    every round, so a step stopped by its cap leaves the rounds it finished); '' otherwise or without the fields."""
    done = [r["rounds"] for r in rows if "rounds" in r]
    asked = settings.get("rounds")
    if not done or asked is None or min(done) >= asked:
        return ""
    return f" ({min(done)} of {asked} rounds: the step was stopped before the rest)"


def check_crop(results: Results) -> Verdict:
    target = f"step cache + tokens ('ours-both') >= {MIN_CROP_SPEEDUP}x on the 512 face crop"
    rows, settings = _speed_rows(results, "cache512")
    both = [r for r in rows if str(r["variant"]).startswith("ours-both")]
    if not both:
        return Verdict("cache512", target, "not measured", "no ours-both row in cache512.json")
    values = [f"{r['variant']} {r['x_wall']:.2f}x" for r in rows if r["variant"] != "unpatched"]
    where = f"guide {settings.get('guide', '?')}, {settings.get('steps', '?')} steps, {settings.get('device', '?')}"
    ok = all(r["x_wall"] >= MIN_CROP_SPEEDUP for r in both)
    detail = f"{where}: " + _fmt(values) + _rounds_note(rows, settings)
    return Verdict("cache512", target, "met" if ok else "MISSED", detail)


def report_plan(results: Results) -> Verdict:
    rows = [r for r in _rows(results, "plan") if r["variant"].startswith("ours")]
    if not rows:
        return Verdict("plan", "(no target) the plan's levels kept or dropped", "not measured", "no plan.json")
    values = [f"{_where(r)} {r['variant']} {r['vs_base']:.3f}x {r.get('device_aware') or ''}".strip() for r in rows]
    return Verdict("plan", "(no target) the plan's levels kept or dropped", "report", _fmt(values))


def report_compiled_cache(results: Results) -> Verdict:
    rows, settings = _speed_rows(results, "compiled_cache")
    target = "(no target) the step cache under TorchCompileModel"
    if not rows:
        return Verdict("compiled_cache", target, "not measured", "no compiled_cache.json")
    values = [f"{r['variant']} {r['x_wall']:.2f}x" for r in rows if r["variant"] != "unpatched"]
    if len(rows) < 2:  # step_cache.py writes the compiled variants one by one: only the unpatched one finished
        values.append("only the unpatched variant finished")
    return Verdict("compiled_cache", target, "report", f"{settings.get('compile', '?')}: " + _fmt(values))


CHECKS: list[Callable[[Results], Verdict]] = [
    check_syncs,
    check_sampling_syncs,
    lambda res: check_ratio(res, "sd15_512"),
    check_match_cost,
    report_plan,
    check_crop,
    lambda res: check_ratio(res, "sdxl_1024"),
    lambda res: check_ratio(res, "compiled"),
    report_compiled_cache,
]


def verdicts(results: Results) -> list[Verdict]:
    """Every check; a timed check whose step ran on the CPU (QUICK smoke) says "cpu smoke" instead of met / MISSED,
    step by step (a smoke whose unet_step steps all timed out must not read its CPU step-cache figure as a GPU one)."""
    found = [check(results) for check in CHECKS]
    cpu_run = on_cpu(results)
    return [
        replace(v, status="cpu smoke")
        if v.status in ("met", "MISSED") and (cpu_run or step_on_cpu(results.get(v.name, {})))
        else v
        for v in found
    ]


def step_on_cpu(data: dict[str, Any]) -> bool:
    """Whether one step's JSON was measured on the CPU: unet_step rows' device, or step_cache's settings.device."""
    devices = {r.get("device") for r in data.get("rows", []) if "model" in r}
    if "settings" in data:
        devices.add(data["settings"].get("device"))
    return bool(devices) and devices <= {"cpu"}


def on_cpu(results: Results) -> bool:
    """Whether the timed steps ran on the CPU (a QUICK smoke): then no figure here means anything for issue 11."""
    devices = {r.get("device") for step in results.values() for r in step.get("rows", []) if "model" in r}
    devices |= {step["settings"].get("device") for step in results.values() if "settings" in step}
    return bool(devices) and devices <= {"cpu"}


def markdown(results: Results) -> str:
    """The unet_step tables (every step with model rows) as Markdown, attention backend and dtype named."""
    out = []
    for step, data in results.items():
        rows = [r for r in data.get("rows", []) if "model" in r]
        if not rows:
            continue
        first = rows[0]
        out.append(
            f"\n**{step}** ({first['device']}, {first.get('dtype', '?')}, {first.get('backend', '?')}"
            + (f", compiled {first['compile']}" if first.get("compile") else "")
            + ")\n"
        )
        out.append("| model | size | batch | variant | step ms | vs base | match ms | match / saved | levels |")
        out.append("|---|---|---|---|---|---|---|---|---|")
        for r in rows:
            share, match = match_share(rows, r), r.get("match_ms")
            out.append(
                f"| {r['model']} | {r['size']} | {r['batch']} | {r['variant']} | {r['step_ms']:.2f} | "
                f"{r['vs_base']:.3f}x | {'' if match is None else f'{match:.2f}'} | "
                f"{'' if share is None else f'{share:.1%}'} | {r.get('device_aware') or ''} |"
            )
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("results", type=Path, help="results.tgz of bench/gpu_issue11.sh, or the folder of its JSONs")
    parser.add_argument("--markdown", action="store_true", help="also print the unet_step rows as Markdown tables")
    parser.add_argument("--strict", action="store_true", help="exit 1 if a target is missed")
    args = parser.parse_args(argv)
    results = load_results(args.results)
    if not results:
        print(f"gpu_verdict: no step JSON in {args.results}")
        return 1
    print(f"issue 11 targets, from {args.results} ({len(results)} step files)")
    if on_cpu(results):
        print("CPU run (QUICK smoke): the figures check the plumbing only; no target is decided by them")
    found = verdicts(results)
    for v in found:
        print(f"[{v.status}] {v.name}: {v.target}\n    {v.detail}")
    missed = [v.name for v in found if v.status == "MISSED"]
    print(
        f"met {sum(v.status == 'met' for v in found)}, missed {len(missed)}"
        f"{' (' + ', '.join(missed) + ')' if missed else ''}, "
        f"not measured {sum(v.status == 'not measured' for v in found)}, "
        f"cpu smoke {sum(v.status == 'cpu smoke' for v in found)}"
    )
    if args.markdown:
        print(markdown(results))
    return 1 if args.strict and missed else 0


if __name__ == "__main__":
    sys.exit(main())
