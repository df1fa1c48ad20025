#!/usr/bin/env python3
"""Run the declared experiments on this machine's GPU when their evidence is missing or stale, then render
the evidence pages under docs/ from every recorded run.

    python tools/build_results.py                  run what is missing or stale here (CUDA only), render
    python tools/build_results.py SLUG [SLUG ...]  the same, for these experiments only
    python tools/build_results.py --all            run every selected experiment, even with fresh evidence
    python tools/build_results.py --run SLUG       the same as --all (a new run even if fresh)
    python tools/build_results.py --render-only    render from the recorded runs; never run anything
    python tools/build_results.py --list           slugs, titles and verdicts per GPU

    python tools/build_results.py --run SLUG --with-profiling [--profile-points N] [--profile-profiles a,b]
                                                   after the timed run, profile some points under Nsight
                                                   Compute (ncu) and keep its facts in the same record

Without CUDA nothing is run: the pages are rendered from the recorded runs (one line says so).

Profiling never fails a run: without ncu, or when ncu cannot read the GPU's counters, the timed record is
written with the reason in its profiling block (lab.measure.profiling).

    python tools/build_results.py --cluster [ADDRESS] [--run] [SLUG ...]
                                                   the same, spread over every GPU that Ray offers: embedded
                                                   on this machine (one worker per local GPU), or the
                                                   cluster at ADDRESS (HOST:PORT, or $RAY_ADDRESS); each
                                                   (experiment, GPU model) pair runs once, one experiment per
                                                   GPU at a time; needs the extra: pip install -e '.[cluster]'

Every record is validated before anything renders (lab.evidence.records); one that fails is skipped with
its path and the failing field named, and the pages render from the rest. A render that would take runs
off the pages (an experiment or a GPU left with none) warns first.

Exit codes: 0 done; 1 a run failed outside the per-profile isolation (the records of completed runs are
kept); 2 bad arguments, an unknown slug, --run/--all without CUDA, --cluster without Ray or without a
cluster that answers, or a records folder that is missing or cannot be read (nothing is rendered); 3 with
--strict, some record files were skipped as invalid (the pages were still rendered from the rest), or the
render would take runs off the pages (then nothing is written); 130 a cluster run stopped by Ctrl-C (the
records that landed are kept, nothing is rendered).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from experiments import all_experiments  # noqa: E402
from experiments.decisions import DECISIONS  # noqa: E402
from lab.evidence.hashing import source_hashes  # noqa: E402
from lab.evidence.store import RecordsFolderError  # noqa: E402
from lab.evidence.verdict import CLOCK_NAMES, STALE  # noqa: E402
from lab.measure.profiling import DEFAULT_MAX_POINTS, ProfilingRequest  # noqa: E402
from lab.publish.collect import collect_evidence  # noqa: E402
from lab.publish.figures import cited_runs  # noqa: E402
from lab.publish.notebook import load_rounds, render_notebook  # noqa: E402
from lab.publish.render import lost_evidence, render_outputs, write_outputs  # noqa: E402
from lab.evidence.render_inputs import render_fingerprint, store_fingerprint  # noqa: E402

EXIT_OK, EXIT_RUN_FAILED, EXIT_USAGE, EXIT_INVALID_RECORDS = 0, 1, 2, 3
EXIT_INTERRUPTED = 130


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="build_results.py",
        description="Run experiments whose evidence for this GPU is missing or stale, then render docs/.",
        epilog="Exit codes: 0 done; 1 a run failed; 2 usage error, --run without CUDA, --cluster without Ray or "
               "a cluster, or no readable records folder; 3 with --strict: invalid records skipped, or runs would "
               "disappear from the pages; 130 a cluster run stopped by Ctrl-C.",
    )
    parser.add_argument("slugs", nargs="*", help="experiments to consider (default: all declared)")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--all", action="store_true", help="run the selected experiments even if their evidence is fresh")
    mode.add_argument("--run", action="store_true", help="force a new run (needs CUDA; exits 2 without it)")
    mode.add_argument("--render-only", action="store_true", help="only render pages from the recorded runs")
    mode.add_argument("--list", action="store_true", help="list slugs, titles and verdicts per GPU, then exit")
    parser.add_argument("--records-dir", type=Path, default=ROOT / "records", help="where run records live")
    parser.add_argument("--docs-dir", type=Path, default=ROOT / "docs", help="where generated pages go")
    parser.add_argument("--device", default="cuda", help="CUDA device to run on (default: cuda)")
    parser.add_argument("--strict", action="store_true",
                        help="exit 3 when any record file is invalid; render nothing if runs would leave the pages")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.add_argument("--cluster", nargs="?", const="", metavar="ADDRESS",
                        help="spread the runs over Ray workers, one per GPU: embedded on this machine, or the "
                             "cluster at ADDRESS (HOST:PORT; default $RAY_ADDRESS); needs pip install -e '.[cluster]'")
    profiling = parser.add_argument_group(
        "profiling", "Nsight Compute facts per point, taken after the timed run in a separate process")
    profiling.add_argument("--with-profiling", action="store_true",
                           help="profile each run's claim subject and baselines under ncu before its record is written")
    profiling.add_argument("--profile-points", type=int, metavar="N",
                           help=f"points (case × dtype) profiled per experiment, spread evenly, first and last "
                                f"included; 0 = all (default {DEFAULT_MAX_POINTS})")
    profiling.add_argument("--profile-profiles", metavar="A,B,...",
                           help="profile these profiles instead of the claim's subject and baselines")
    profiling.add_argument("--ncu", default="ncu", help="the ncu executable (default: ncu on PATH)")
    return parser.parse_args(argv)


def profiling_request(args: argparse.Namespace, experiments, selected) -> ProfilingRequest | None:
    """The profiling the arguments ask for (None without --with-profiling); ValueError naming what is wrong."""
    asked = [flag for flag, given in (("--profile-points", args.profile_points is not None),
                                      ("--profile-profiles", args.profile_profiles is not None),
                                      ("--ncu", args.ncu != "ncu")) if given]
    if not args.with_profiling:
        if asked:
            raise ValueError(f"{', '.join(asked)} only apply with --with-profiling")
        return None
    if args.render_only or args.list:
        raise ValueError("--with-profiling profiles new runs; --render-only and --list run nothing")
    points = DEFAULT_MAX_POINTS if args.profile_points is None else args.profile_points
    if points < 0:
        raise ValueError(f"--profile-points {points}: expected 0 (every point) or a positive count")
    names = None
    if args.profile_profiles is not None:
        names = tuple(n.strip() for n in args.profile_profiles.split(",") if n.strip())
        declared = {p.name for slug in selected for p in experiments[slug].profiles}
        unknown = [n for n in names if n not in declared]
        if not names or unknown:
            raise ValueError(f"--profile-profiles: {', '.join(unknown) or 'no name given'} is not a profile of "
                             f"the selected experiments (profiles: {', '.join(sorted(declared))})")
    return ProfilingRequest(max_points=points, profiles=names, ncu=args.ncu)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cluster is not None:
        problem = cluster_usage(args)
        if problem:
            print(f"build_results: {problem}", file=sys.stderr)
            return EXIT_USAGE
    experiments = all_experiments()
    unknown = [s for s in args.slugs if s not in experiments]
    if unknown:
        print(f"build_results: unknown experiment(s) {', '.join(unknown)}; declared: {', '.join(experiments)}",
              file=sys.stderr)
        return EXIT_USAGE
    selected = args.slugs or list(experiments)
    try:
        profiling = profiling_request(args, experiments, selected)
    except ValueError as exc:
        print(f"build_results: {exc}", file=sys.stderr)
        return EXIT_USAGE
    hashes = {slug: source_hashes(e, ROOT) for slug, e in experiments.items()}

    def evidence(report: bool = True, before_runs: bool = False):
        # Before runs, a records folder that does not exist yet holds no records (the runs make it); a render
        # from a folder that is not there is an error, never "No evidence" everywhere.
        found = collect_evidence(experiments, DECISIONS, args.records_dir, hashes, missing_ok=before_runs)
        for problem in found.problems if report else ():
            print(f"build_results: skipped {problem}", file=sys.stderr)
        return found

    has_cuda = torch.cuda.is_available()
    if args.cluster is None and (args.run or args.all) and not has_cuda:
        print("build_results: --run/--all need a CUDA GPU and none is available here; "
              "use --render-only to render from the recorded runs", file=sys.stderr)
        return EXIT_USAGE
    running = args.cluster is None and has_cuda and not (args.render_only or args.list)

    try:
        if args.list:
            return list_experiments(evidence(), selected)
        if args.cluster is not None:  # the GPUs are the workers': this machine needs none
            status = run_on_cluster(experiments, selected, evidence(False, before_runs=True),
                                    force=args.run or args.all, args=args, profiling=profiling)
            if status in (EXIT_USAGE, EXIT_INTERRUPTED):  # no cluster to run on, or stopped: nothing rendered
                return status
            args.records_dir.mkdir(parents=True, exist_ok=True)  # the runs may have had nothing to record
            return finish(args, evidence(), status)
        status = EXIT_OK
        if running:
            status = run_needed(experiments, selected, evidence(False, before_runs=True), force=args.run or args.all,
                                args=args, profiling=profiling)
            args.records_dir.mkdir(parents=True, exist_ok=True)
        elif not args.render_only:
            print("build_results: no CUDA GPU here: rendering from the recorded runs only")
        return finish(args, evidence(), status)
    except RecordsFolderError as exc:
        print(f"build_results: {exc}; nothing was rendered (--records-dir names the folder of run records)",
              file=sys.stderr)
        return EXIT_USAGE


def finish(args: argparse.Namespace, found, status: int) -> int:
    """Render the pages from every recorded run under --docs-dir; the exit status, given the runs' `status`.

    A render that would take runs off the pages (every record of an experiment, or of a GPU, now skipped or
    gone) says so first, and under --strict refuses: nothing is written."""
    # The inputs as they are before the render: `mkdocs serve` (tools/mkdocs_hooks.py) renders again only
    # when they change after it. Kept only for the checkout's own records and pages.
    default_dirs = (args.records_dir.resolve() == (ROOT / "records").resolve()
                    and args.docs_dir.resolve() == (ROOT / "docs").resolve())
    fingerprint = render_fingerprint(ROOT) if default_dirs else None
    notebook, skipped = render_notebook(ROOT)  # the probe rounds' pages, from probes/rounds.toml and notes/probes/
    listed = [r for r in load_rounds(ROOT)[0] if f"probes/{r.id}.md" in notebook]  # rounds with a page
    outputs = render_outputs(found, cited_in(args.docs_dir, found), listed)
    for problem in skipped:
        print(f"build_results: skipped {problem}", file=sys.stderr)
    outputs.update(notebook)
    lost = lost_evidence(outputs, args.docs_dir)
    for line in lost:
        print(f"build_results: WARNING: evidence would disappear: {line}", file=sys.stderr)
    if lost and args.strict:
        print("build_results: --strict: nothing was rendered; fix or restore the records named above, or "
              "render without --strict to accept the loss", file=sys.stderr)
        return EXIT_INVALID_RECORDS
    report = write_outputs(outputs, args.docs_dir)
    if fingerprint is not None:
        store_fingerprint(ROOT, fingerprint)
    print(f"build_results: rendered {len(report.written)} changed, {len(report.unchanged)} unchanged, "
          f"{len(report.removed)} removed file(s) under {args.docs_dir}")
    if status == EXIT_OK and args.strict and (found.problems or skipped):
        return EXIT_INVALID_RECORDS
    return status


def cited_in(docs_dir: Path, found) -> set[str]:
    """The runs that pages under docs_dir cite by id (`{{ fig(..., run="...") }}`): the site serves their
    records too, and their experiment's history links them (lab.publish.served)."""
    texts = []
    for path in sorted(docs_dir.rglob("*.md")) if docs_dir.is_dir() else ():
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError):
            continue  # a page MkDocs cannot read either; the build names it
    return cited_runs(texts, found)


def why_run(found, slug: str, key: str, force: bool) -> str | None:
    """Why `slug` runs on GPU model `key` ("forced", "stale", "no evidence on this GPU"); None: its evidence
    there is fresh."""
    verdict = found.verdicts[slug].get(key)
    if force:
        return "forced"
    if verdict is None:
        return "no evidence on this GPU"
    return "stale" if verdict.state == STALE else None


def run_needed(experiments, selected, found, *, force: bool, args, profiling: ProfilingRequest | None = None) -> int:
    """Run each selected experiment whose evidence on this GPU is missing or stale (all of them if forced)."""
    from lab.measure.environment import gpu_key
    from lab.measure.runner import run_experiment

    key = gpu_key(torch.cuda.get_device_name(torch.device(args.device)))
    status = EXIT_OK
    for slug in selected:
        why = why_run(found, slug, key, force)
        if why is None:
            print(f"build_results: {slug}: evidence on {key} is fresh ({found.verdicts[slug][key].state}); not running")
            continue
        print(f"build_results: {slug}: running on {key} ({why})")
        try:
            _, path = run_experiment(experiments[slug], device=args.device, records_dir=args.records_dir,
                                     root=ROOT, progress=not args.no_progress, profiling=profiling,
                                     say=lambda message, slug=slug: print(f"build_results: {slug}: {message}"))
        except Exception as exc:  # noqa: BLE001 - report, keep the other experiments' runs going
            print(f"build_results: {slug}: the run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            status = EXIT_RUN_FAILED
            continue
        print(f"build_results: {slug}: wrote {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}")
    return status


def cluster_usage(args: argparse.Namespace) -> str | None:
    """What is wrong with a --cluster command line (None: nothing); `--cluster SLUG` is read as a slug."""
    from lab.measure.cluster import ClusterError, import_ray, looks_like_address

    if args.cluster and not looks_like_address(args.cluster):
        args.slugs.insert(0, args.cluster)
        args.cluster = ""
    if args.render_only or args.list:
        return "--cluster runs experiments; --render-only and --list run nothing"
    if args.device not in ("cuda", "cpu"):
        return (f"--device {args.device}: with --cluster every worker runs on the GPU Ray gave it; accepted: cuda "
                f"(or cpu, through Triton's interpreter with TRITON_INTERPRET=1, to check the machinery)")
    try:
        import_ray()
    except ClusterError as exc:
        return str(exc)
    return None


def run_on_cluster(experiments, selected, found, *, force: bool, args, profiling: ProfilingRequest | None) -> int:
    """Run each selected experiment on each GPU model of the cluster where its evidence is missing or stale
    (all of them if forced); the records land in args.records_dir, written here."""
    from tqdm.auto import tqdm

    from lab.measure import cluster, dispatch
    from lab.measure.environment import command_line, git_state

    def why(slug: str, key: str) -> str | None:
        reason = why_run(found, slug, key, force)
        if reason is None:
            print(f"build_results: {slug}: evidence on {key} is fresh ({found.verdicts[slug][key].state}); not running")
        return reason

    try:
        outcome = dispatch.run_on_cluster(
            experiments, selected, why, address=cluster.resolve_address(args.cluster), device=args.device,
            records_dir=args.records_dir, provenance={"command": command_line(ROOT), "git": git_state(ROOT)},
            profiling=profiling, progress=not args.no_progress, say=lambda m: tqdm.write(f"build_results: {m}"),
            expected=lambda task: cluster.last_duration(
                found.runs.get(task.slug, []), task.gpu_key,
                points=len(experiments[task.slug].cases) * len(experiments[task.slug].dtypes)))
    except cluster.ClusterError as exc:
        print(f"build_results: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        print("build_results: interrupted before any experiment ran", file=sys.stderr)
        return EXIT_INTERRUPTED
    print(f"build_results: cluster: {len(outcome.written)} record(s) written, {len(outcome.failed)} failed, "
          f"{len(outcome.cancelled)} cancelled")
    for task, why_failed in outcome.failed:
        print(f"build_results: failed: {task}: {why_failed}", file=sys.stderr)
    for task in outcome.cancelled:
        print(f"build_results: cancelled: {task}", file=sys.stderr)
    if outcome.interrupted:
        return EXIT_INTERRUPTED
    return EXIT_RUN_FAILED if outcome.failed else EXIT_OK


def list_experiments(found, selected) -> int:
    names = found.gpu_names
    for slug in selected:
        experiment = found.experiments[slug]
        verdicts = found.claim_verdicts(slug)  # on the clock the claim speaks of
        clock = CLOCK_NAMES[experiment.claim.clock]
        states = "; ".join(f"{names[k]}: {v.state} ({clock})" for k, v in verdicts.items()) or "No evidence"
        print(f"{slug}\t{experiment.title}\t{states}")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
