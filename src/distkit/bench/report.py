"""The printed table and the verdict of ``--check``."""
from __future__ import annotations

import math

from distkit.bench.method import TARGETS

def _rate(x):
    return f"{x:,.0f}/s" if x is not None and not math.isnan(x) else "-"


def _status(cmp):
    return "ok" if cmp["within_target"] else "OVER TARGET"


def table(results: dict) -> str:
    """The printed summary: one line per ratio."""
    m, v = results["machine"], results["versions"]
    lines = [f"distkit bench ({results['mode']}): {m['cores']} cores, {m['cpu']}, torch {v['torch']}, "
             f"ignite {v['ignite']}, load average {m['load_average']} -> {m.get('load_average_end')}"]
    if results.get("note"):
        lines.append(f"note: {results['note']}")
    row = "{:<46} {:>10} {:>13} {:>6} {:>6}  {}"
    if "overhead" in results or "ddp" in results or "gpu" in results:
        lines += ["", row.format("kit vs hand-written (medians)", "kit", "hand-written", "ratio",
                                 "cpu", "target (on ratio)")]

    def kit_row(label, kit, hand, cmp, target=True):
        cpu = f"{cmp['cpu_ratio']:.3f}" if "cpu_ratio" in cmp else "-"
        verdict = (f">= {1 - cmp['target_cost']:.2f} {_status(cmp)}" if target else "(not a target)")
        return row.format(label, _rate(kit["median"]), _rate(hand["median"]) if hand else "",
                          f"{cmp['ratio']:.3f}", cpu, verdict)

    if "overhead" in results:
        o = results["overhead"]
        hand = o["sides"]["hand-written"]
        lines.append(kit_row(f"1 overhead, 1 process ({o['model']}, batch {o['batch_size']}, "
                             f"{o['threads']} thr)", o["sides"]["kit"], hand, o))
        for name, cmp in o["variants"].items():
            if name != "kit":
                lines.append(kit_row(f"    {name}", o["sides"][name], None, cmp, target=False))
        per = o["per_step_us"]
        extra = per["kit_extra_cpu_us_per_step"]
        step_ms = per["hand_written_step_ms_of_the_real_model"]
        lines.append(f"    the kit's own cost per step ({per['model']}, 1 thread): {extra['kit']:+.0f} us of CPU "
                     f"(create_trainer only {extra['kit: create_trainer only']:+.0f}, with progress bar "
                     f"{extra['kit + progress bar']:+.0f}); against a {step_ms:.1f} ms step: "
                     f"{step_ms / (step_ms + extra['kit'] / 1000):.3f} expected")
    if "ddp" in results:
        d = results["ddp"]
        lines.append(kit_row(f"2 DDP overhead, {d['world_size']} gloo processes (batch "
                             f"{d['global_batch_size']})", d["sides"]["kit"], d["sides"]["hand-written"], d))
        per = d["per_step_us"]
        extra, step_ms = per["kit_extra_cpu_us_per_step_per_process"], per["hand_written_step_ms_of_the_real_model"]
        lines.append(f"    the kit's own cost per step and process ({per['model']}): {extra:+.0f} us of "
                     f"CPU; against a {step_ms:.1f} ms step: {step_ms / (step_ms + extra / 1000):.3f} expected")
    if "gpu" in results:
        g = results["gpu"]
        if "skipped" in g:
            lines.append(f"5 GPU (ResNet-18, bf16, channels_last): skipped: {g['skipped']}")
        else:
            lines.append(kit_row(f"5 GPU {g['device']} (ResNet-18 bf16 cl)", g["sides"]["kit"],
                                 g["sides"]["hand-written"], g))
    if any(k in results for k in ("overhead", "ddp")):
        lines.append("(ratio: samples/s, wall clock; cpu: samples per CPU-second, steadier on a "
                     "shared machine)")
    if "scaling" in results:
        s = results["scaling"]
        lines += ["", f"3 scaling (the kit's trainer; {s['threads_per_process']} thread(s) per process "
                      f"unless noted; {s['cores']} cores)",
                  "{:<12} {:<22} {:>5} {:>6} {:>12} {:>10}".format(
                      "model", "variant", "world", "batch", "samples/s", "threads")]
        for name, mod in s["models"].items():
            for p in mod["points"]:
                lines.append("{:<12} {:<22} {:>5} {:>6} {:>12} {:>10}".format(
                    name, p["variant"], p["world_size"], p["global_batch"], _rate(p["median"]),
                    p["threads_per_process"]))
            lines.append(f"{'':<12} efficiency strong {mod['strong_efficiency']:.2f}  weak "
                         f"{mod['weak_efficiency']:.2f}  all-reduced/step "
                         f"{mod['allreduce_bytes_per_step'] / 2**20:.2f} MiB (measured "
                         f"{mod['allreduce_bytes_per_step_measured'] / 2**20:.2f})  unpinned threads: "
                         f"{mod['oversubscribed_slowdown']:.2f}x slower")
            if "step_costs" in mod:  # the scaling study's probe (distkit.lessons.scaling)
                c = mod["step_costs"]
                lines.append(f"{'':<12} one step at {c['per_process_batch']} per process: compute "
                             f"{1e3 * c['compute_s']:.2f} ms, with all-reduce {1e3 * c['step_s']:.2f} ms, "
                             f"all-reduce alone {1e3 * c['allreduce_s']:.2f} ms "
                             f"(communication {c['communication_share']:.0%} of the step)")
    if "data" in results:
        d = results["data"]
        lines += ["", f"4 data pipeline (batch {d['batch_size']}; loader alone vs compute alone; "
                      f"pin_memory {d['pin_memory']})"]
        for pname, p in d["pipelines"].items():
            loaders = "  ".join(f"{k.split()[0]} {_rate(v['median'])} (start {v['startup_s_median']:.2f} s)"
                                for k, v in p["loader"].items())
            lines.append(f"  {pname}: loader {loaders}")
            for model, verdict in p["verdict"].items():
                keep = verdict["fewest_workers_to_keep_up"]
                lines.append(f"      {model}: compute {_rate(verdict['compute_samples_per_s'])} "
                             f"({verdict['compute_ms_per_batch']:.1f} ms/batch): "
                             + ("data-bound with 0 workers; " if verdict["data_bound_with_0_workers"]
                                else "compute-bound with 0 workers; ")
                             + (f"{keep} worker(s) keep up" if keep is not None
                                else "no tested worker count keeps up"))
    if "peers" in results:
        lines += _peers_lines(results["peers"])
    if "hangs" in results:
        lines += _hangs_lines(results["hangs"])
    if "pool" in results:
        idle = results["pool"]["pool_idle"]
        lines.append(f"\n(the process pool used {idle['idle_cpu_s']:.2f} s of CPU while waiting "
                     f"{idle['idle_wall_s']:.1f} s for its turn)")
    lines.append(f"done in {results['duration_s']:.0f} s")
    if results.get("files"):
        lines.append(f"results: {results['files']['json']}  chart: {results['files']['png']}")
    return "\n".join(lines)


def targets_missed(results: dict) -> list:
    """Names of the measurements that miss their target (a skipped one has no verdict)."""
    return [k for k in TARGETS if k in results and "within_target" in results[k]
            and not results[k]["within_target"]]


def _num(x, fmt):
    return format(x, fmt) if x is not None else "-"


def _peers_lines(p) -> list:
    """Whole commands: one row per contender, medians over rounds; ratios and deltas are
    paired with the hand-written loop's run of the same round."""
    lines = []
    row = "{:<26} {:>11} {:>7} {:>12} {:>8} {:>9} {:>8} {:>9}"
    for key, title in (("default_batch", "global batch {b}"), ("tiny_steps", "tiny steps, global batch {b}")):
        if key not in p:
            continue
        c = p[key]
        lines += ["", f"6 peers: whole commands, {title.format(b=c['batch_size'])} "
                      f"({c['per_process_batch']} per process), {c['epochs']} epochs, "
                      f"{c['rounds']} rounds; load average {p['load_average']['start']} -> "
                      f"{p['load_average']['end']}",
                  row.format("contender", "samples/s", "ratio", "first step s", "(delta)", "wall s",
                             "(delta)", "peak MiB")]
        for name, e in c["contenders"].items():
            m = e["median"]
            lines.append(row.format(
                name, _rate(m["samples_per_s"]) if "samples_per_s" in m else "-",
                _num(e.get("throughput_ratio"), ".3f"),
                _num(m.get("first_step_s"), ".2f"), _num(e.get("first_step_delta_s"), "+.2f"),
                _num(m.get("wall_s"), ".2f"), _num(e.get("wall_delta_s"), "+.2f"),
                _num(m.get("peak_rss_mib"), ".0f")))
        for name, e in c["contenders"].items():
            for f in e.get("failures", []):
                lines.append(f"    {name} failed in round {f['round']}{' (warm-up)' if f['warm_up'] else ''}, "
                             f"attempt {f['attempt']}: {f['exit']}: {' / '.join(f['stderr_last_lines'])}")
            if e.get("failed_rounds"):
                lines.append(f"    {name}: rounds {e['failed_rounds']} failed on every attempt: "
                             f"left out of its medians and ratios")
        for name, why in c.get("skipped", {}).items():
            lines.append(f"{name:<26} skipped: {why}")
        if "default_launch_vs_torchrun" in c:
            lines.append(f"    distkit under its own launch / under torchrun, samples/s: "
                         f"{_num(c['default_launch_vs_torchrun'], '.3f')} (target >= 0.97)")
    lines.append("    (ratio and deltas: against the hand-written torchrun loop of the same round)")
    return lines


def _pct(x):
    return f"{100 * x:+.2f} %" if x is not None else "-"


def _hangs_lines(h) -> list:
    """The hang records' cost per step: the pieces (the verdict), then the whole-step
    comparisons a loaded machine may not resolve."""
    if "skipped" in h:
        return ["", f"7 hang records: skipped: {h['skipped']}"]
    p, w = h["pieces"], h["whole_steps"]
    verdict = "ok" if h["within_target"] else "OVER TARGET"
    lines = ["", f"7 hang records, on in every run the kit starts: {h['world_size']} {h['backend']} ranks, "
                 f"{h['model']}, {len(h['rounds'])} rounds of recorder off/on",
             f"    Flight Recorder: {p['recorder_cpu_us_per_entry']:+.2f} us of CPU per entry x "
             f"{p['entries_per_step']:.2f} entries a step = {p['recorder_us_per_step']:.1f} us",
             f"    watcher thread: {p['watcher_cpu_us_per_poll']:.1f} us of CPU per poll x "
             f"{p['polls_per_s']} polls/s over a {p['step_wall_us']:.0f} us step = {p['watcher_us_per_step']:.2f} us",
             f"    per step: {_pct(h['cost'])} of its {p['step_cpu_us']:.0f} us of CPU, "
             f"{_pct(h['wall_cost'])} of its {p['step_wall_us']:.0f} us of wall "
             f"(target <= {100 * h['target_cost']:g} % of CPU) {verdict}"]
    for what, name in (("step_cpu_s", "CPU"), ("step_wall_s", "wall")):
        rec, wat = w[what]["recorder"], w[what]["watcher"]
        q = (lambda s: f" (quartiles {', '.join(_pct(x) for x in s['quartiles'])})" if s["quartiles"] else "")
        lines.append(f"    whole steps, {name}: recorder {_pct(rec['median'])}{q(rec)}, one more watcher "
                     f"{_pct(wat['median'])}{q(wat)}")
    return lines
