"""The Python package against the command line and its own promises: the same summary as `twin sim --json`,
overrides in each form that change the result, ScenarioError naming the field, sweep and search as DataFrames."""
import json
import os
import subprocess
import tempfile
import tomllib

import pytest

import twin

SMALL = {"parallel": {"global_batch": 128}}  # GPT-3 175B with 8 micro-batches per pipeline: a fraction of a second
WALL_CLOCK = {"wall_s", "peak_rss_bytes", "activities_per_s"}


def without_wall_clock(value):
    if isinstance(value, dict):
        return {k: without_wall_clock(v) for k, v in value.items() if k not in WALL_CLOCK}
    if isinstance(value, list):
        return [without_wall_clock(v) for v in value]
    return value


def cli_json(*arguments):
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "out.json")
        subprocess.run([os.environ["TWIN_BINARY"], *arguments, "--quiet", "--json", path], check=True,
                       stdout=subprocess.DEVNULL)
        with open(path, encoding="utf-8") as f:
            return json.load(f)


def test_simulate_is_the_cli_json():
    cli = cli_json("sim", "gpt3-175b", "--set", "parallel.global_batch=128", "--train-tokens", "300B",
                   "--usd-per-gpu-hour", "2.5", "--goodput")
    python = twin.simulate("gpt3-175b", train_tokens="300B", usd_per_gpu_hour=2.5, goodput=True, **SMALL)
    assert without_wall_clock(python) == without_wall_clock(cli)
    assert python["training"]["cost_usd"] == pytest.approx(python["training"]["gpu_hours"] * 2.5)


def test_every_form_of_override_is_the_same_and_changes_the_result():
    as_section = twin.simulate("gpt3-175b", cluster={"nodes": 64}, **SMALL)
    as_dunder = twin.simulate("gpt3-175b", cluster__nodes=64, parallel__global_batch=128)
    as_dotted = twin.simulate("gpt3-175b", **{"cluster.nodes": 64, "parallel.global_batch": 128})
    assert as_section["iteration_time_s"] == as_dunder["iteration_time_s"] == as_dotted["iteration_time_s"]
    twice = twin.simulate("gpt3-175b", cluster={"nodes": 128}, **SMALL)
    assert twice["scenario"]["gpus"] == 2 * as_section["scenario"]["gpus"]
    assert twice["iteration_time_s"] < as_section["iteration_time_s"]


def test_a_scenario_from_a_dict_is_the_file():
    source = os.path.join(os.environ["TWIN_SOURCE_DIR"], "scenarios", "gpt3-175b.toml")
    with open(source, "rb") as f:
        sections = tomllib.load(f)
    scenario = twin.load_scenario(sections, **SMALL)
    assert scenario.name == twin.load_scenario("gpt3-175b").name
    assert twin.simulate(scenario)["iteration_time_s"] == twin.simulate("gpt3-175b", **SMALL)["iteration_time_s"]


def test_scenario_error_names_the_field():
    with pytest.raises(twin.ScenarioError) as error:
        twin.load_scenario("gpt3-175b", model={"layers": 0})
    assert isinstance(error.value, ValueError)
    assert error.value.field == "model.layers"
    assert "model.layers" in str(error.value)
    with pytest.raises(twin.ScenarioError) as error:
        twin.simulate("gpt3-175b", train_tokens="lots", **SMALL)
    assert error.value.field == "train_tokens"
    with pytest.raises(twin.ScenarioError) as error:
        twin.load_scenario("no-such-scenario")
    assert error.value.field is None


def test_graph_is_the_program():
    program = twin.graph("gpt3-175b", **SMALL)
    assert program["scenario"]["pp"] == len(program["stages"]) == 8


def test_sweep_returns_a_data_frame_with_a_row_per_variant():
    pandas = pytest.importorskip("pandas")
    frame = twin.sweep("gpt3-175b", vary={"cluster.nodes": [64, 128], "parallel.tp": [3, 8]}, **SMALL)
    assert isinstance(frame, pandas.DataFrame)
    for column in ("cluster.nodes", "parallel.tp", "gpus", "iteration_time_s", "tflops_per_gpu", "bubble_fraction",
                   "memory_per_gpu_bytes", "fits", "tokens_per_s", "time_split", "error"):
        assert column in frame.columns, column
    assert list(frame["cluster.nodes"]) == [64, 64, 128, 128]
    refused = frame[frame["parallel.tp"] == 3]
    assert all(error.startswith("invalid: ") for error in refused["error"])
    simulated = frame[frame["parallel.tp"] == 8]
    assert list(simulated["error"]) == ["", ""]
    assert simulated["iteration_time_s"].iloc[1] < simulated["iteration_time_s"].iloc[0]


def test_search_ranks_the_plans_fastest_first():
    plans = twin.search("gpt3-175b", max_plans=3, **SMALL)
    rows = plans.to_dict("records") if hasattr(plans, "to_dict") else plans
    assert len(rows) == 3
    times = [row["iteration_time_s"] for row in rows if not row["error"]]
    assert times == sorted(times) and times[0] > 0
    assert {"tp", "pp", "dp", "cp", "ep", "micro_batch", "schedule", "fits"} <= set(rows[0])


def test_days_mark_the_rows_and_name_the_fewest_gpus_that_finish():
    vary = {"cluster.nodes": [64, 128]}
    forever = twin.sweep("gpt3-175b", vary=vary, train_tokens="300B", days=1e9, **SMALL)
    rows = forever.to_dict("records") if hasattr(forever, "to_dict") else list(forever)
    assert [row["finishes_in_days"] for row in rows] == [True, True]
    best = forever.attrs["fewest_gpus_within_days"]
    assert best["gpus"] == min(row["gpus"] for row in rows)
    never = twin.sweep("gpt3-175b", vary=vary, train_tokens="300B", days=1e-6, **SMALL)
    assert never.attrs["fewest_gpus_within_days"] is None
    plans = twin.search("gpt3-175b", max_plans=2, train_tokens="300B", days=1e9, **SMALL)
    assert plans.attrs["fewest_gpus_within_days"] is not None
    with pytest.raises(twin.ScenarioError) as error:
        twin.search("gpt3-175b", max_plans=2, days=30, **SMALL)  # no run to time
    assert error.value.field == "days"
    with pytest.raises(twin.ScenarioError) as error:
        twin.sweep("gpt3-175b", vary=vary, train_tokens="300B", days=-1, **SMALL)
    assert error.value.field == "days"


def test_compare_with_a_published_time_and_with_another_summary():
    predicted = twin.simulate("gpt3-175b", **SMALL)
    against_time = twin.compare(predicted, 2 * predicted["iteration_time_s"])
    assert "iteration time" in against_time.table
    other = twin.simulate("gpt3-175b", cluster={"nodes": 64}, **SMALL)
    with pytest.raises(twin.ScenarioError):
        twin.compare(predicted, other)  # not the same run
    assert twin.compare(predicted, other, allow_mismatch=True).table
