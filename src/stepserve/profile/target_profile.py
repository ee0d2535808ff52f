"""A target profile (schema `stepserve.target-profile/1`): what `profile --target URL`
learnt of one server, in one JSON file:

* `target`: the URL, the model, the engine kind its /metrics prefix names, max_model_len;
* `cost`: the fitted step-time model in the cost file's own form (`stepserve.cost/1`),
  so `simulate --cost FILE`, `bench --sim --cost FILE` and `sweep` take the profile
  itself (sim/cost_options.py reads the `cost` part);
* `settings`: each inferred setting's value, confidence and evidence;
* `spread`: the measured jitter of steps and of the HTTP path, as data;
* `fit_error`: the held-out error of the fit;
* `probes`: every probe's raw figures, so `profile --refit FILE` infers and fits again
  offline (ProbeFigures: nothing else of the file is read back).

`simulate`/`bench --sim`/`sweep --cost FILE` apply the settings (beneath the flags and
the run's own, sim/target_settings.py) and draw step times from the spread
(sim/spread.py).
"""

from __future__ import annotations

import datetime
from dataclasses import asdict, dataclass
from typing import Any

from stepserve.profile.infer import InferredSettings, infer_settings
from stepserve.profile.probe_figures import ProbeFigures
from stepserve.profile.target_fit import TargetFit, fit_target
from stepserve.sim.calibrated import TARGET_PROFILE_SCHEMA

# the engine flags an inferred setting stands for (simulate's and serve's names)
FLAGS = {"max_num_seqs": "--max-num-seqs", "token_budget": "--max-num-batched-tokens",
         "prefix_caching": "--enable-prefix-caching"}


@dataclass(frozen=True)
class TargetProfile:
    figures: ProbeFigures
    settings: InferredSettings
    fit: TargetFit

    def to_json(self) -> dict[str, Any]:
        t = self.figures.target
        engine = t.engine or "unknown engine"
        meta = {"hardware": f"{engine} server at {t.url}", "model": t.model,
                "date": datetime.date.today().isoformat(), "measured_by": "profile --target",
                "fit_error": self.fit.held_out_error}
        cost = {**self.fit.cost.to_json(), **meta}
        return {"schema": TARGET_PROFILE_SCHEMA,
                "target": {"url": t.url, "model": t.model, "engine": t.engine,
                           "max_model_len": t.max_model_len},
                "cost": cost,
                "settings": {name: inf.to_json() for name, inf in self.settings.items()},
                "spread": asdict(self.fit.spread),
                "fit_error": self.fit.held_out_error,
                "notes": list(self.figures.notes),
                "probes": self.figures.to_json()}


def build_profile(figs: ProbeFigures) -> TargetProfile:
    """Infer the settings and fit the cost model from the probes' figures."""
    settings = infer_settings(figs)
    return TargetProfile(figs, settings, fit_target(figs, settings))


def figures_from_profile(data: Any) -> ProbeFigures:
    """The raw figures of a target profile file's JSON; ValueError naming what is wrong."""
    if not isinstance(data, dict) or data.get("schema") != TARGET_PROFILE_SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise ValueError(f"not a target profile (schema {schema!r}, expected "
                         f"{TARGET_PROFILE_SCHEMA!r})")
    return ProbeFigures.from_json(data.get("probes"))


def report(profile: TargetProfile) -> str:
    t, fit = profile.figures.target, profile.fit
    lines = [f"target {t.url}: model {t.model!r}, engine {t.engine or 'unknown (no /metrics)'}"
             f", max_model_len {t.max_model_len}, prompts as {t.prompt_form}",
             *(f"note: {n}" for n in profile.figures.notes),
             "inferred settings:"]
    for name, inf in profile.settings.items():
        lines.append(f"  {name:<19} {inf.shown()}")
    flags = [f"{FLAGS[name]} {inf.value}" for name, inf in profile.settings.items()
             if name in FLAGS and inf.value is not None and not inf.at_least
             and not isinstance(inf.value, bool)]
    if flags:
        lines.append(f"  simulate --cost FILE applies them (as {' '.join(flags)})")
    e = fit.held_out_error
    lines += [f"step cost model from {fit.rows} measured times, t = sum of:",
              *fit.cost.explain()]
    if "median" in e:
        lines.append(f"fit error on {int(e['points'])} held-out times: median "
                     f"{e['median']:.1%}, p90 {e['p90']:.1%}, max {e['max']:.1%}")
    s = fit.spread
    gap, floor = s.step_gap.quantiles, s.http_floor.quantiles
    if gap:
        lines.append(f"spread: decode gaps p99 {gap['p99']:.2f}x, max {gap['max']:.2f}x the "
                     f"median ({s.step_gap.count} gaps)")
    if floor:
        lines.append(f"spread: HTTP floor {s.http_floor.median_s * 1e3:.2f} ms median, p99 "
                     f"{floor['p99']:.2f}x; path overhead {s.http_overhead_s * 1e3:.2f} ms")
    if s.mixed_growth is not None:
        lines.append(f"a long prompt into running decodes: their gap grew {s.mixed_growth:.2f}x")
    return "\n".join(lines)
