"""twin: a digital twin of large-scale Transformer training, from Python.

The same library as the ``twin`` command (api/twin.hpp): each call returns what the command's ``--json`` writes, as
Python dicts and lists.

    import twin
    summary = twin.simulate("mtnlg-530b", cluster={"nodes": 350})
    print(summary["iteration_time_s"], summary["memory"]["fits"])
    table = twin.sweep("gpt3-175b", vary={"cluster.nodes": [64, 128, 256]})   # a pandas DataFrame

A scenario is a name under scenarios/ ("mtnlg-530b"), a TOML file, a dict of its sections, or a Scenario from
load_scenario. Overrides are keyword arguments, as ``twin --set`` takes them: a section's dict (``parallel={"tp": 8}``),
``parallel__tp=8``, or ``**{"parallel.tp": 8}``. Mistakes raise ScenarioError (a ValueError) naming the field.
"""
import json
import os
import tempfile

from . import _twin

__all__ = ["Scenario", "ScenarioError", "Rows", "load_scenario", "graph", "simulate", "sweep", "search", "compare"]

ScenarioError = _twin.ScenarioError
ScenarioError.__module__ = __name__
ScenarioError.__doc__ = ("A scenario, option or file twin refuses (a ValueError): `field` is the scenario key or "
                         "option it names (\"parallel.tp\", \"train_tokens\"), None when it names none; `problems` "
                         "lists every problem, one sentence each.")

# An installed package carries its own copy of scenarios/; the build tree's module knows the source tree's.
_PACKAGED_SCENARIOS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scenarios")
if os.path.isdir(_PACKAGED_SCENARIOS) and "TWIN_SCENARIOS" not in os.environ:
    _twin.set_scenario_directory(_PACKAGED_SCENARIOS)

# The options of a simulation (twin sim's flags, dashes as underscores); every other keyword is an override.
_SIM_OPTIONS = {"fidelity", "granularity", "gpu", "profile", "placement", "algorithm", "oversubscription",
                "rail_optimized", "ideal_network", "sensitivity_percent", "train_tokens", "usd_per_gpu_hour",
                "goodput", "slow_gpus", "slow_links", "failed_uplinks", "slow_gpu_fraction", "slow_gpu_factor", "seed"}
_SEARCH_SPACE = {"vary_recompute", "vary_sequence_parallel", "vary_zero", "vary_schedule", "vary_etp", "vary_cp",
                 "memory_headroom", "vary_node", "max_plans", "all", "explain"}


def _toml_value(value):
    """A Python value as TOML value text."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return json.dumps(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k} = {_toml_value(v)}" for k, v in value.items()) + "}"
    raise ScenarioError(f"cannot write {value!r} ({type(value).__name__}) as a TOML value")


def _override_text(value):
    """An override's value as `--set` takes it: text as typed (a bare word is a string), the rest as TOML."""
    return value if isinstance(value, str) else _toml_value(value)


def _overrides(keywords):
    """["parallel.tp=8", ...] from keyword overrides: section dicts, section__key, or "section.key"."""
    sets = []
    for key, value in keywords.items():
        if isinstance(value, dict) and "." not in key and "__" not in key:
            sets += [f"{key}.{inner}={_override_text(v)}" for inner, v in value.items()]
        else:
            sets.append(f"{key.replace('__', '.')}={_override_text(value)}")
    return sets


class Scenario:
    """A validated scenario: where it comes from (a name or path, or TOML text) and its overrides.

    name: the model's name; source: its file (or "<scenario text>"); toml: the whole scenario as TOML."""

    def __init__(self, source, is_text, sets):
        self._source, self._is_text, self._sets = source, is_text, list(sets)
        self.name, self.source, self.toml = _twin.scenario_toml(source, is_text, self._sets)
        self._file = None

    def with_overrides(self, sets):
        return Scenario(self._source, self._is_text, self._sets + list(sets))

    def path(self):
        """A file holding the scenario (a sweep or search reads it by path): its own, or a temporary copy."""
        if not self._is_text:
            return _twin.resolve_scenario_path(self._source), self._sets
        if self._file is None:
            handle, self._file = tempfile.mkstemp(prefix="twin-scenario-", suffix=".toml")
            with os.fdopen(handle, "w") as f:
                f.write(self._source)
        return self._file, self._sets

    def __del__(self):
        if getattr(self, "_file", None):
            try:
                os.unlink(self._file)
            except OSError:
                pass

    def __repr__(self):
        return f"Scenario({self.name!r}, source={self.source!r}, overrides={self._sets!r})"


def _dict_as_toml(sections):
    lines = []
    for section, keys in sections.items():
        if not isinstance(keys, dict):
            raise ScenarioError(f"scenario dict: '{section}' must be a section of keys (model, parallel, cluster, "
                                f"framework, training), got {type(keys).__name__}")
        lines.append(f"[{section}]")
        lines += [f"{key} = {_toml_value(value)}" for key, value in keys.items()]
        lines.append("")
    return "\n".join(lines)


def load_scenario(path_or_dict="mtnlg-530b", **overrides):
    """The scenario named ("mtnlg-530b"), at a path, or given as a dict of sections, with `overrides` on top,
    validated. Raises ScenarioError naming the field when it is wrong."""
    sets = _overrides(overrides)
    if isinstance(path_or_dict, Scenario):
        return path_or_dict.with_overrides(sets)
    if isinstance(path_or_dict, dict):
        return Scenario(_dict_as_toml(path_or_dict), True, sets)
    return Scenario(os.fspath(path_or_dict), False, sets)


def _split(keywords, names):
    options = {k: v for k, v in keywords.items() if k in names}
    return options, {k: v for k, v in keywords.items() if k not in names}


def _prepare_options(options):
    if "train_tokens" in options:
        options["train_tokens"] = str(options["train_tokens"])
    return options


def graph(scenario="mtnlg-530b", granularity="layer", **overrides):
    """The Program (`twin graph --json`): the scenario's plan and, per stage, its schedule and ops."""
    s = load_scenario(scenario, **overrides)
    return json.loads(_twin.graph(s._source, s._is_text, s._sets, granularity))


def simulate(scenario="mtnlg-530b", **keywords):
    """One simulated iteration: the summary `twin sim --json` writes (iteration_time_s, tflops_per_gpu, memory,
    time_split, per-stage rows, ...). Keywords are twin sim's options (fidelity, granularity, gpu, train_tokens,
    usd_per_gpu_hour, goodput, sensitivity_percent, ...) or overrides of the scenario."""
    options, overrides = _split(keywords, _SIM_OPTIONS)
    s = load_scenario(scenario, **overrides)
    return json.loads(_twin.simulate(s._source, s._is_text, s._sets, _prepare_options(options)))


class Rows(list):
    """The rows as a list of dicts when pandas does not import; `attrs` as a DataFrame's."""

    def __init__(self, rows=()):
        super().__init__(rows)
        self.attrs = {}


def _frame(rows, document=None):
    """A pandas DataFrame of `rows` when pandas imports, else Rows. With days=, the document's answer (the row with
    the fewest GPUs that finishes, or None) is in the result's attrs["fewest_gpus_within_days"]."""
    try:
        import pandas
        frame = pandas.DataFrame(rows)
    except ImportError:
        frame = Rows(rows)
    if document is not None and "fewest_gpus_within_days" in document:
        frame.attrs["fewest_gpus_within_days"] = document["fewest_gpus_within_days"]
    return frame


def _days(keywords):
    """days=D (`--days D`) out of the keywords: a number of days, 0 when not given."""
    days = keywords.pop("days", None)
    return 0.0 if days is None else float(days)


def _typed(text):
    """A varied value as typed ("280", "true", "\"1f1b\"") as a number, bool or string."""
    try:
        return json.loads(text)
    except ValueError:
        return text


def sweep(scenario="mtnlg-530b", vary=None, **keywords):
    """The scenario at every combination of `vary` ({"cluster.nodes": [280, 350, 420], ...}), one row per variant
    (`twin sweep --json`'s variants): the varied keys as columns, then gpus, iteration_time_s, tflops_per_gpu,
    bubble_fraction, memory_per_gpu_bytes, fits, tokens_per_s, error (and time_split, training, goodput). A pandas
    DataFrame when pandas imports, a list of dicts otherwise. Variants are simulated one after another here (the
    command fans them out over processes). days=D (with train_tokens): a finishes_in_days column, and in the result's
    attrs["fewest_gpus_within_days"] the variant with the fewest GPUs that finishes within D days (None if none)."""
    if not vary:
        raise ScenarioError("vary: give at least one key and its values, e.g. vary={'cluster.nodes': [64, 128]}")
    days = _days(keywords)
    options, overrides = _split(keywords, _SIM_OPTIONS)
    path, sets = load_scenario(scenario, **overrides).path()
    varies = []
    for key, values in vary.items():
        values = values if isinstance(values, (list, tuple)) else [values]
        varies.append(f"{key.replace('__', '.')}=" + ",".join(_override_text(v) for v in values))
    document = json.loads(_twin.sweep(path, sets, varies, _prepare_options(options), days))
    rows = []
    for variant in document["variants"]:
        row = {key: _typed(value) for key, value in variant.pop("set").items()}
        row.update(variant)
        rows.append(row)
    return _frame(rows, document)


def search(scenario="mtnlg-530b", **keywords):
    """Every parallel plan that fits, simulated and ranked fastest first (`twin search --json`'s plans): tp, pp, dp,
    cp, ep, etp, micro_batch, schedule, virtual_stages, recompute, ..., iteration_time_s, tflops_per_gpu, fits, error.
    Keywords: the search's (max_plans, all, explain, memory_headroom, vary_recompute, vary_sequence_parallel,
    vary_zero, vary_schedule, vary_etp, vary_cp, vary_node), a simulation's (train_tokens, usd_per_gpu_hour,
    goodput), days=D (with train_tokens: a finishes_in_days column, and in the result's
    attrs["fewest_gpus_within_days"] the plan with the fewest GPUs that finishes within D days, None if none) or
    overrides. A pandas DataFrame when pandas imports, a list of dicts otherwise."""
    days = _days(keywords)
    space, rest = _split(keywords, _SEARCH_SPACE)
    options, overrides = _split(rest, _SIM_OPTIONS)
    if "memory_headroom" in space:
        space["memory_headroom"] = str(space["memory_headroom"])
    path, sets = load_scenario(scenario, **overrides).path()
    document = json.loads(_twin.search(path, sets, space, _prepare_options(options), days))
    return _frame(document["plans"], document)


class Comparison(dict):
    """The comparison document (`twin compare --json`), with the table `twin compare` prints as .table."""

    table = ""


def compare(predicted, measured, allow_mismatch=False, iterations=0, fastest_step=False, top=10):
    """A prediction next to a measurement (`twin compare`): `predicted` a summary dict (simulate's) or a JSON file;
    `measured` another summary dict, a number of seconds, or a file (twin run --json, a profiler trace or a folder of
    them, a Megatron-LM / NeMo / torchtitan log)."""
    if isinstance(predicted, dict):
        predicted_text, predicted_name = json.dumps(predicted), "the prediction"
    else:
        with open(predicted, encoding="utf-8") as f:
            predicted_text, predicted_name = f.read(), os.fspath(predicted)
    if isinstance(measured, dict):
        measured_text, is_document, measured_name = json.dumps(measured), True, "the measurement"
    else:
        measured_text = repr(float(measured)) if isinstance(measured, (int, float)) else os.fspath(measured)
        is_document, measured_name = False, measured_text
    result = json.loads(_twin.compare(predicted_text, predicted_name, measured_text, is_document, measured_name,
                                      allow_mismatch, iterations, fastest_step, top))
    comparison = Comparison(result["document"])
    comparison.table = result["table"]
    return comparison
