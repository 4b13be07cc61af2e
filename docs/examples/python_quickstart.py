# twin from Python, cell by cell (a notebook in a file: each "# %%" is a cell). ctest runs it
# (Python.DocsExampleRuns), so every line here works as written. docs/python.md says more.

# %% One iteration of MT-NLG 530B on 280 DGX A100 nodes: what `twin sim --json` writes, as a dict.
import twin

summary = twin.simulate("mtnlg-530b")
print(f"{summary['iteration_time_s']:.3f} s per iteration, {summary['tflops_per_gpu']:.1f} TFLOP/s per GPU, "
      f"{summary['memory_per_gpu_bytes'] / 2**30:.1f} GiB per GPU")

# %% The same with overrides, as `--set` takes them: a section's dict, section__key, or "section.key".
bigger = twin.simulate("mtnlg-530b", cluster={"nodes": 420}, parallel__global_batch=1920)
print(f"420 nodes: {bigger['iteration_time_s']:.3f} s")

# %% A whole run's cost: GPT-3 175B on 300 B tokens at $2 per GPU-hour.
run = twin.simulate("gpt3-175b", train_tokens="300B", usd_per_gpu_hour=2.0)["training"]
print(f"GPT-3 175B: {run['days']:.1f} days, ${run['cost_usd'] / 1e6:.2f} M")

# %% A sweep: one row per variant, a pandas DataFrame when pandas is installed.
table = twin.sweep("gpt3-175b", vary={"cluster.nodes": [64, 128, 256]}, parallel={"global_batch": 256})
rows = table.to_dict("records") if hasattr(table, "to_dict") else table
for row in rows:
    print(f"{row['cluster.nodes']:4d} nodes  {row['iteration_time_s']:8.3f} s  {row['tokens_per_s']:10.0f} tokens/s")

# %% A search: the plans that fit, fastest first (here the four fastest, proven by a lower bound on the others).
plans = twin.search("gpt3-175b", max_plans=4, parallel={"global_batch": 256})
best = (plans.to_dict("records") if hasattr(plans, "to_dict") else plans)[0]
print(f"fastest: tp {best['tp']} pp {best['pp']} dp {best['dp']}, {best['iteration_time_s']:.3f} s")

# %% A prediction against a measurement: here the published 60.1 s of MT-NLG on 280 nodes.
print(twin.compare(summary, 60.1).table)

# %% Mistakes name their field.
try:
    twin.simulate("mtnlg-530b", parallel={"schedule": "2f2b"})
except twin.ScenarioError as error:
    assert error.field == "parallel.schedule"
    print(f"refused: {error.problems[0].split(': ', 1)[1]}")
