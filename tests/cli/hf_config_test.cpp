// `--hf-config config.json` (api/hf_config.hpp): a Hugging Face config as the scenario's model, for graph, sim, sweep
// and search; and a pasted Megatron-LM launch line whose flags twin does not model are listed as ignored
// (cli/main.cpp).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "tests/cli/run_twin.hpp"

namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using Result = twin::testing::ShellResult;

Result twin(const std::string& arguments) {
  return twin::testing::run_shell(std::string(TWIN_BINARY) + " " + arguments + " 2>&1");
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::temp_directory_path() / ("twin-hf-config-test-" + std::to_string(getpid()));
  fs::create_directories(dir);
  return dir / name;
}

std::string write(const std::string& name, const std::string& contents) {
  const fs::path path = scratch(name);
  std::ofstream(path) << contents;
  return path.string();
}

std::string contents(const std::string& path) {
  std::ifstream in(path);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A dense GPT on two DGX A100 nodes (tp 2 x pp 2): the base the configs replace the model of.
std::string gpt_scenario() {
  return write("gpt.toml",
               "[model]\nname = \"gpt-1.3b\"\nlayers = 24\nhidden = 2048\nheads = 16\nseq_len = 2048\n"
               "vocab = 50257\n[parallel]\ntp = 2\npp = 2\nglobal_batch = 32\n[cluster]\nnodes = 2\n"
               "node = \"dgx-a100\"\n");
}

// A Llama-style config.json (the keys of Meta's Llama 3 8B release, smaller sizes) as transformers writes it.
const char* kLlama = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "_name_or_path": "example/llama-small",
  "hidden_size": 2048, "intermediate_size": 5632, "num_hidden_layers": 16, "num_attention_heads": 16,
  "num_key_value_heads": 4, "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-05,
  "rope_theta": 500000.0, "rope_scaling": null, "hidden_act": "silu", "tie_word_embeddings": false,
  "attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16", "bos_token_id": 1
})";

// The config.json of Qwen/Qwen3-30B-A3B as released (its model keys; tokenizer and generation keys left out).
const char* kQwen3Moe = R"({
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "hidden_size": 2048,
  "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
  "head_dim": 128, "vocab_size": 151936, "max_position_embeddings": 40960, "rms_norm_eps": 1e-06,
  "rope_theta": 1000000.0, "hidden_act": "silu", "tie_word_embeddings": false, "attention_bias": false,
  "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768, "decoder_sparse_step": 1,
  "mlp_only_layers": [], "norm_topk_prob": true, "output_router_logits": false
})";

// The Llama-style config builds the same Program (byte for byte in `twin graph --json`) as the keys it stands for.
TEST(HfConfig, ALlamaStyleConfigIsTheModelOfItsKeys) {
  const std::string config = write("llama.json", kLlama);
  const std::string from_config = scratch("llama-config.json"), from_keys = scratch("llama-keys.json");
  const Result graph = twin("graph " + gpt_scenario() + " --hf-config " + config + " --json " + from_config);
  ASSERT_EQ(graph.status, 0) << graph.output;
  EXPECT_THAT(graph.output, HasSubstr("16 layers, hidden 2048, 16 heads, ffn 5632, seq 2048, vocab 32000"));
  EXPECT_THAT(graph.output, HasSubstr("rotary positions, RMSNorm, SwiGLU, 4 key/value heads"));
  EXPECT_THAT(graph.output, HasSubstr("scenario      llama-small"));  // _name_or_path's last part
  const Result keys = twin("graph " + gpt_scenario() +
                           " --set model.name=llama-small --set model.layers=16 --set model.ffn_hidden=5632"
                           " --set model.kv_heads=4 --set model.vocab=32000 --set model.activation=swiglu"
                           " --set model.norm=rmsnorm --set model.position_embedding=rope --set model.linear_bias=false"
                           " --set framework.tied_embeddings=false --json " +
                           from_keys);
  ASSERT_EQ(keys.status, 0) << keys.output;
  EXPECT_FALSE(contents(from_config).empty());
  EXPECT_EQ(contents(from_config), contents(from_keys));
  // the command line wins over the file: a training sequence shorter than the longest context
  EXPECT_THAT(twin("graph " + gpt_scenario() + " --hf-config " + config + " --seq-length 1024").output,
              HasSubstr("seq 1024"));
}

// Qwen3-30B-A3B's released config.json gives scenarios/qwen3-30b-a3b.toml's model exactly (that file was written from
// it by hand): the same Program, byte for byte, once the name and the training sequence (4096) are the scenario's.
TEST(HfConfig, AQwen3MoeConfigIsTheHandWrittenScenariosModel) {
  const std::string config = write("qwen3.json", kQwen3Moe);
  const std::string from_config = scratch("qwen-config.json"), scenario = scratch("qwen-scenario.json");
  const Result graph = twin("graph qwen3-30b-a3b --granularity layer --hf-config " + config +
                            " --seq-length 4096 --set model.name=qwen3-30b-a3b --json " + from_config);
  ASSERT_EQ(graph.status, 0) << graph.output;
  EXPECT_THAT(graph.output, HasSubstr("experts       128 routed (top 8) of width 768"));
  EXPECT_THAT(graph.output, HasSubstr("heads of 128 dimensions"));
  ASSERT_EQ(twin("graph qwen3-30b-a3b --granularity layer --json " + scenario).status, 0);
  EXPECT_FALSE(contents(from_config).empty());
  EXPECT_EQ(contents(from_config), contents(scenario));
  // on a dense scenario the experts come with the config (Mixtral's num_local_experts too)
  std::string mixtral = kLlama;
  mixtral.replace(mixtral.find("\"llama\""), 7, "\"mixtral\"");
  mixtral.replace(mixtral.find("\"bos_token_id\""), 0, "\"num_local_experts\": 8, \"num_experts_per_tok\": 2, ");
  EXPECT_THAT(twin("graph " + gpt_scenario() + " --hf-config " + write("mixtral.json", mixtral)).output,
              HasSubstr("8 routed (top 2) of width 5632"));
}

TEST(HfConfig, SimSweepAndSearchTakeIt) {
  const std::string config = write("llama.json", kLlama);
  const Result sim = twin("sim " + gpt_scenario() + " --quiet --hf-config " + config);
  ASSERT_EQ(sim.status, 0) << sim.output;
  EXPECT_THAT(sim.output, HasSubstr("llama-small: 16 GPUs"));
  const Result sweep =
      twin("sweep " + gpt_scenario() + " --quiet --hf-config " + config + " --vary parallel.micro_batch=1,2");
  ASSERT_EQ(sweep.status, 0) << sweep.output;
  EXPECT_THAT(sweep.output, HasSubstr("llama-small"));
  const Result search = twin("search " + gpt_scenario() + " --quiet --max 2 --hf-config " + config);
  ASSERT_EQ(search.status, 0) << search.output;
  EXPECT_THAT(search.output, HasSubstr("llama-small"));
}

// An architecture twin knows takes the defaults of its config class; one it does not must give every key, and the
// first one missing is named.
TEST(HfConfig, AMissingKeyIsNamed) {
  const std::string unknown = write("unknown.json", R"({"model_type": "foo", "hidden_size": 64,
      "num_hidden_layers": 2, "num_attention_heads": 4, "intermediate_size": 256, "vocab_size": 256,
      "max_position_embeddings": 32})");
  const Result r = twin("graph gpt-tiny --hf-config " + unknown);
  EXPECT_EQ(r.status, 2) << r.output;
  EXPECT_THAT(r.output, HasSubstr("twin: error: --hf-config " + unknown +
                                  ": num_key_value_heads is missing: "
                                  "model_type \"foo\" is not one twin knows"));
  EXPECT_EQ(std::count(r.output.begin(), r.output.end(), '\n'), 1) << r.output;
  // a Llama without num_key_value_heads is multi-head (LlamaConfig's default), without hidden_size it is nothing
  std::string llama = kLlama;
  llama.erase(llama.find("\"num_key_value_heads\": 4,"), 25);
  EXPECT_THAT(twin("graph " + gpt_scenario() + " --hf-config " + write("mha.json", llama)).output,
              HasSubstr("16 heads, ffn 5632"));
  llama.erase(llama.find("\"hidden_size\": 2048,"), 20);
  const Result no_hidden = twin("graph gpt-tiny --hf-config " + write("none.json", llama));
  EXPECT_EQ(no_hidden.status, 2);
  EXPECT_THAT(no_hidden.output, HasSubstr("hidden_size is missing (model_type \"llama\" has no default for it)"));
  const Result wrong = twin("graph gpt-tiny --hf-config " + write("wrong.json", R"({"model_type": "llama",
      "hidden_size": "big"})"));
  EXPECT_EQ(wrong.status, 2);
  EXPECT_THAT(wrong.output, HasSubstr("hidden_size must be a whole number of at least 1, got \"big\""));
  EXPECT_THAT(twin("graph gpt-tiny --hf-config " + scratch("absent.json").string()).output,
              HasSubstr("absent.json: cannot be read"));
}

// A pasted Megatron-LM launch line: with one of twin's Megatron-style aliases on it, the flags twin does not model
// (and their values) are left out and listed in one note, and the Program is that of the plan flags alone. Without an
// alias on the line, an unknown flag is a typo and fails by name.
TEST(HfConfig, APastedMegatronLineListsTheFlagsItIgnores) {
  const std::string scenario = gpt_scenario();
  const std::string pasted = scratch("pasted.json"), plan = scratch("plan.json");
  const Result r = twin("graph " + scenario +
                        " --tensor-model-parallel-size 1 --lr 3e-4 --max-position-embeddings 4096 --use-mcore-models"
                        " --lr-decay-style=cosine --seq-length 1024 --json " +
                        pasted);
  ASSERT_EQ(r.status, 0) << r.output;
  EXPECT_THAT(r.output, HasSubstr("note: ignored 4 Megatron-LM flags twin does not model: --lr, "
                                  "--max-position-embeddings, --use-mcore-models, --lr-decay-style\n"));
  ASSERT_EQ(twin("graph " + scenario + " --tensor-model-parallel-size 1 --seq-length 1024 --json " + plan).status, 0);
  EXPECT_EQ(contents(pasted), contents(plan));
#ifdef TWIN_HAVE_RUN_COMMAND
  // once per job: not once more by each rank `twin run --launcher mpi` starts with the same command line
  if (twin::testing::run_shell("command -v mpirun >/dev/null").status == 0) {
    const Result mpi = twin("run gpt-tiny --quiet --steps 1 --launcher mpi --data-parallel-size 2 --lr 3e-4");
    EXPECT_EQ(mpi.status, 0) << mpi.output;
    const std::string note = "note: ignored 1 Megatron-LM flag twin does not model: --lr\n";
    ASSERT_NE(mpi.output.find(note), std::string::npos) << mpi.output;
    EXPECT_EQ(mpi.output.find(note, mpi.output.find(note) + 1), std::string::npos) << mpi.output;
  }
#endif
  const Result typo = twin("graph " + scenario + " --lr 3e-4");
  EXPECT_EQ(typo.status, 2);
  EXPECT_THAT(typo.output, HasSubstr("twin: error: twin graph: unknown flag --lr"));
}

}  // namespace
