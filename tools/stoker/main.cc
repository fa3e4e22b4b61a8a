// The `stoker` command line: pack, index, inspect, verify, ls, bench, cache,
// checkpoint, gpu. Parsing here; each subcommand in its own file.
#include <string_view>

#include <fmt/format.h>

#include "commands.h"
#include "stoker/loader.h"
#include "stoker/status.h"
#include "usage_hint.h"

int main(int argc, char** argv) {
  using namespace stoker_cli;
  if (argc >= 3 && std::string_view(argv[1]) == "gpu" && std::string_view(argv[2]) == "device-plugin")
    return RunGpuDevicePluginCommand(argc - 3, argv + 3);
  CLI::App app{"stoker: keep deep-learning GPUs busy. Packs small files into indexed WebDataset shards."};
  app.require_subcommand(1);
  app.set_version_flag("--version", "stoker 0.1.0");

  std::string source, out, shard_size = "64MiB", index_output, dataset;
  unsigned threads = 0;
  bool force = false, json = false;
  std::vector<std::string> shards;
  RemoteArgs remote;

  auto* pack =
      app.add_subcommand("pack",
                         "Pack an ImageFolder tree, a CSV/JSONL manifest, tar shards or Parquet files (Hugging Face "
                         "datasets) into indexed shards");
  pack->add_option("SRC", source,
                   "ImageFolder directory, manifest (.csv/.jsonl), shards (.tar, brace patterns allowed, "
                   "or a folder of them) or Parquet/Arrow (.parquet or .arrow, glob patterns allowed, or a folder "
                   "of them such as a Hugging Face save_to_disk; read with pyarrow)")
      ->required();
  pack->add_option("OUT", out, "Output folder for shard-NNNNNN.tar and index.stoker")->required();
  pack->add_option("--shard-size", shard_size, "Target shard size, e.g. 64MiB, 1GB")->capture_default_str();
  pack->add_option("--threads", threads, "Reader threads (default: automatic; at most 1024)")
      ->check(CLI::Range(0, 1024));
  pack->add_flag("--force", force, "Replace a dataset already in OUT (and remove stale shards there)");
  std::uint32_t max_side = 0;
  int quality = 90;
  auto* max_side_opt =
      pack->add_option("--max-side", max_side,
                       "Re-encode JPEGs whose longest side (EXIF orientation applied) is over N pixels to N "
                       "(aspect kept, Pillow's antialiased bilinear); smaller images stay byte-identical")
          ->check(CLI::Range(1u, 65500u));
  pack->add_option("--quality", quality, "JPEG quality of re-encoded images, 1-100")
      ->check(CLI::Range(1, 100))
      ->needs(max_side_opt)
      ->capture_default_str();
  bool seekable_jpeg = false;
  pack->add_flag("--seekable-jpeg", seekable_jpeg,
                 "Re-write baseline JPEGs losslessly with restart markers (same pixels, checked) and record where "
                 "each restart interval starts, so the loader decodes only what a crop covers");
  bool keep_bad_images = false;
  pack->add_flag("--keep-bad-images", keep_bad_images,
                 "Store image files that fail the header check (empty, not an image by their first bytes, a GIF, a "
                 "cut header) as they are, counted and named, instead of stopping at the first");
  bool shuffle = false;
  std::uint64_t shuffle_seed = 0;
  auto* shuffle_flag = pack->add_flag("--shuffle", shuffle,
                                      "Write the samples in a random order (shards then mix classes, so shard-aware "
                                      "orders such as a remote dataset's give varied batches)");
  pack->add_option("--shuffle-seed", shuffle_seed, "Seed of --shuffle (the same seed gives the same shards)")
      ->needs(shuffle_flag)
      ->capture_default_str();
  std::vector<std::string> file_columns;
  pack->add_option("--file-column", file_columns,
                   "A manifest column holding a second file per sample besides `path`, e.g. mask: it becomes the "
                   "field mask.<ext> (mask.png); repeat it or give a comma-separated list")
      ->delimiter(',');

  auto* index = app.add_subcommand("index", "Build the index for existing WebDataset shards");
  index
      ->add_option("SHARDS", shards,
                   "Shard files, brace patterns such as data-{000000..000099}.tar, or folders (their .tar files)")
      ->required();
  index->add_option("-o,--output", index_output, "Index file to write (default: index.stoker beside the first shard)");
  index->add_flag("--force", force, "Replace an existing index");
  bool index_keep_bad_images = false;
  index->add_flag("--keep-bad-images", index_keep_bad_images,
                  "Index image members that fail the header check (empty, not an image by their first bytes, a GIF, "
                  "a cut header) as they are, counted and named, instead of stopping at the first");

  auto* merge = app.add_subcommand(
      "merge", "One dataset from several written apart (a DatasetWriter per worker): an index over all their shards");
  std::string merge_output;
  std::vector<std::string> merge_parts;
  merge->add_option("OUTPUT", merge_output, "Folder for the merged index; every part must lie inside it")->required();
  merge->add_option("PARTS", merge_parts, "Dataset folders (or index files) to merge, in this order")->required();
  merge->add_flag("--force", force, "Replace an existing index in OUTPUT");

  auto* inspect = app.add_subcommand(
      "inspect",
      "Summarise a dataset: samples, shards, fields, bytes, labels (or a token dataset's documents and tokens)");
  inspect->add_option("DATASET", dataset, "Dataset folder, index file or URL, or a Megatron token dataset's PREFIX")
      ->required();
  inspect->add_flag("--json", json, "Print a machine-readable summary");
  std::uint64_t survey_images = 0;
  inspect->add_option("--images", survey_images,
                      "Also read the JPEG headers of N samples spread over the dataset (1000 is plenty): sizes, what "
                      "pack --max-side would re-encode, coding, where decode=\"gpu\" would decode them");
  std::uint64_t seq_len = 2048;
  inspect
      ->add_option("--seq-len", seq_len,
                   "Megatron token datasets (DATASET a PREFIX of PREFIX.idx + PREFIX.bin): show the rows of this many "
                   "tokens an epoch")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));

  auto* verify = app.add_subcommand("verify", "Check every checksum and label; name each corrupt sample");
  verify->add_option("DATASET", dataset, "Dataset folder, index file or URL, or a Megatron token dataset's PREFIX")
      ->required();
  verify->add_flag("--json", json, "Print the report as JSON");
  bool decode = false;
  verify->add_flag("--decode", decode,
                   "Also decode every field by its kind (images, numbers, .npy, text, JSON), as the loader's "
                   "fields= would, and name each that fails");
  TokenVerifyArgs token_verify;
  verify->add_option("--eos", token_verify.eos,
                     "Megatron token datasets: every document must end with this end-of-document token id");
  std::uint64_t& vocab_size = token_verify.vocab_size;
  verify->add_option("--vocab-size", vocab_size,
                     "Megatron token datasets (DATASET a PREFIX of PREFIX.idx + PREFIX.bin): every token id must be "
                     "below this (default: any id that is not negative)");

  auto* list = app.add_subcommand("ls", "List every sample: key, shard:offset, label, fields");
  list->add_option("DATASET", dataset, "Dataset folder, index file or URL")->required();
  list->add_flag("--json", json, "One JSON object per sample (JSON Lines)");

  BenchArgs bench_args;
  auto* bench = app.add_subcommand("bench", "Run the loader over a dataset and report images/s, wait, CPU and memory");
  bench
      ->add_option("DATASET", bench_args.dataset,
                   "Dataset folder, index file, ImageFolder tree or URL, or a Megatron token dataset's PREFIX")
      ->required();
  bench->add_option("--batch-size", bench_args.batch_size, "Images per batch (rows for a token dataset)")
      ->capture_default_str()
      ->check(CLI::Range(1u, stoker::kMaxBatchSize));
  bench->add_option("--threads", bench_args.threads, "Worker threads (default: one per core; at most 1024)")
      ->check(CLI::Range(0u, stoker::kMaxLoaderThreads));
  bench->add_option("--prefetch", bench_args.prefetch, "Batches prepared ahead (default: automatic; at most 64)")
      ->check(CLI::Range(0u, stoker::kMaxPrefetch));
  bench->add_option("--epochs", bench_args.epochs, "Epochs to run, each reported separately")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1000000}));
  bench->add_option("--max-batches", bench_args.max_batches, "Stop each epoch after this many batches");
  bench->add_option("--consumer-ms", bench_args.consumer_ms, "Simulated accelerator step per batch, in ms (>= 0)");
  bench->add_option("--dtype", bench_args.dtype, "float32, float16, bfloat16 or uint8 (NHWC)")
      ->capture_default_str()
      ->check(CLI::IsMember({"float32", "float16", "bfloat16", "uint8"}));
  bench->add_option("--size", bench_args.size, "Output image size")->capture_default_str()->check(CLI::Range(1, 16384));
  bench
      ->add_option("--order", bench_args.order,
                   "auto, shuffle, shard-block or sequential (auto: shuffle, or shard-block for a remote dataset "
                   "whose cache is smaller than the data)")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "shuffle", "shard-block", "sequential"}));
  bench->add_option("--shard-window", bench_args.shard_window,
                    "Shards per window for --order shard-block (default: 8, or for a remote dataset as many as "
                    "three windows fit in the cache)");
  bench
      ->add_option(
          "--kernel-readahead", bench_args.kernel_readahead,
          "The kernel's read-ahead on shard files (local, or a remote dataset's cached copies): auto (off for a "
          "global shuffle over shards larger than "
          "the page cache can hold), on or off")
      ->capture_default_str()
      ->check(CLI::IsMember({"auto", "on", "off"}));
  bench->add_option("--seed", bench_args.seed, "Shuffle and augmentation seed (0 to 2^64-1)")->capture_default_str();
  bench->add_option("--on-corrupt", bench_args.on_corrupt, "error or skip")
      ->capture_default_str()
      ->check(CLI::IsMember({"error", "skip"}));
  bench->add_flag("--eval", bench_args.eval,
                  "Evaluation transform: Resize + CenterCrop (default: RandomResizedCrop + flip)");
  bench->add_flag("--no-verify", bench_args.no_verify,
                  "Do not check each sample against its index record on read (checked by default)");
  bench->add_flag("--json", bench_args.json, "One JSON object per epoch");
  bench
      ->add_option("--seq-len", bench_args.seq_len,
                   "A Megatron token dataset (DATASET its PREFIX): tokens a row; --batch-size is rows a batch")
      ->capture_default_str()
      ->check(CLI::Range(std::uint64_t{1}, std::uint64_t{1} << 24));

  AddRemoteOptions(inspect, remote);
  AddRemoteOptions(verify, remote);
  AddRemoteOptions(list, remote);
  AddRemoteOptions(bench, bench_args.remote);
  auto* cache = app.add_subcommand("cache", "The local cache of remote datasets");
  cache->require_subcommand(1);
  auto* cache_stat = cache->add_subcommand("stat", "What the cache holds");
  auto* cache_clear = cache->add_subcommand("clear", "Remove every cached shard no process is downloading");
  auto* cache_warm = cache->add_subcommand("warm", "Download a remote dataset's shards (as many as fit)");
  cache_warm->add_option("DATASET", dataset, "URL of a remote dataset (http, https, s3)")->required();
  for (auto* c : {cache_stat, cache_clear, cache_warm}) {
    AddRemoteOptions(c, remote);
    c->add_flag("--json", json, "Print JSON");
  }

  std::string checkpoint_path;
  auto* checkpoint = app.add_subcommand("checkpoint", "Inspect checkpoints written by stoker.Checkpointer");
  checkpoint->require_subcommand(1);
  auto* checkpoint_ls = checkpoint->add_subcommand("ls", "List published checkpoints, oldest first");
  checkpoint_ls->add_option("DIR", checkpoint_path, "Checkpoint directory")->required();
  checkpoint_ls->add_flag("--json", json, "One JSON object per checkpoint");
  auto* checkpoint_verify = checkpoint->add_subcommand(
      "verify", "Check every file's checksum and the safetensors rules; name what is corrupt");
  checkpoint_verify->add_option("PATH", checkpoint_path, "A step-N folder, or a directory of them")->required();
  checkpoint_verify->add_flag("--json", json, "One JSON object per checkpoint");

  GpuRunArgs gpu_args;
  std::string gpu_ledger, gpu_leases;
  std::string gpu_wait;
  auto* gpu = app.add_subcommand("gpu", "Share GPUs: hold commands to a memory quota and a compute share");
  gpu->require_subcommand(1);
  auto* gpu_run = gpu->add_subcommand(
      "run",
      "Place COMMAND on the GPU(s) that fit it and run it with the GPU interposer preloaded, held to a memory quota "
      "and a compute share");
  gpu_run->add_option("--memory", gpu_args.memory, "Device memory the command may use on each GPU, e.g. 20GiB");
  gpu_run->add_option("--compute", gpu_args.compute, "Percent of each GPU's time the command may use (1-100)")
      ->check(CLI::Range(1u, 100u));
  gpu_run->add_option("--gpus", gpu_args.gpus,
                      "Number of cards: whole cards alone, or with --memory/--compute that much on each");
  gpu_run->add_option("--policy", gpu_args.policy,
                      "binpack (fill the fullest card that fits; default) or spread (the emptiest)");
  auto* gpu_wait_opt =
      gpu_run
          ->add_option("--wait", gpu_wait,
                       "Wait until the request fits instead of failing at once; optional limit, e.g. 10m")
          ->expected(0, 1);
  gpu_run->add_flag("--no-place", gpu_args.no_place,
                    "Do not choose cards: limit the command on the GPUs it already sees (no lease)");
  gpu_run->add_option(
      "--leases", gpu_args.leases,
      "A lease file (default: $STOKER_GPU_LEASES, else each user's in $STOKER_GPU_DIR, /dev/shm/stoker-gpu)");
  gpu_run->add_option("--device-memory", gpu_args.device_memory,
                      "Per GPU (CUDA ordinal) instead, without placing: ORDINAL=SIZE, repeatable, e.g. 1=8GiB");
  gpu_run->add_option("--tenant", gpu_args.tenant,
                      "Name shared by processes that share one quota (default: run-<pid>)");
  gpu_run->add_option(
      "--ledger", gpu_args.ledger,
      "A memory ledger (default: $STOKER_GPU_LEDGER, else the users' in $STOKER_GPU_DIR, /dev/shm/stoker-gpu)");
  gpu_run->add_flag("--quiet", gpu_args.quiet, "Do not print the limits applied");
  gpu_run->add_option("COMMAND", gpu_args.command, "The command and its arguments (after --)")->required();
  gpu_run->positionals_at_end();
  GpuAgentArgs agent_args;
  auto* gpu_agent = gpu->add_subcommand(
      "agent",
      "As root: keep the node's GPU state folder (root's and sticky before any user can squat it, the compute "
      "schedule), free dead processes' charges and log processes that use a GPU without the interposer");
  gpu_agent->add_option("--dir", agent_args.dir,
                        "The state folder (default: $STOKER_GPU_DIR, else /dev/shm/stoker-gpu)");
  gpu_agent->add_option("--interval", agent_args.interval_seconds, "Seconds between looks")->capture_default_str();
  gpu_agent->add_flag("--once", agent_args.once, "Prepare the folder and exit (for a boot-time unit)");
  auto* gpu_ls = gpu->add_subcommand("ls", "Each GPU's tenants: quotas, use, compute shares, processes");
  gpu_ls->add_option(
      "--ledger", gpu_ledger,
      "A memory ledger (default: $STOKER_GPU_LEDGER, else the users' in $STOKER_GPU_DIR, /dev/shm/stoker-gpu)");
  gpu_ls->add_option(
      "--leases", gpu_leases,
      "A lease file (default: $STOKER_GPU_LEASES, else each user's in $STOKER_GPU_DIR, /dev/shm/stoker-gpu)");
  gpu_ls->add_flag("--json", json, "Print JSON");

  // Listed for --help; `main` hands its arguments to stoker-device-plugin before parsing.
  gpu->add_subcommand("device-plugin",
                      "Kubernetes device plugin: advertise this node's GPUs by memory and compute (or whole cards) "
                      "to the kubelet; run as a DaemonSet (options: stoker gpu device-plugin --help)")
      ->allow_extras();
  GpuExtenderArgs extender_args;
  auto* gpu_extender = gpu->add_subcommand(
      "scheduler-extender", "kube-scheduler extender: filter and score nodes by whether a pod's GPU asks fit one card");
  gpu_extender->add_option("--listen", extender_args.listen, "HOST:PORT for POST /filter and /prioritize")
      ->capture_default_str();
  gpu_extender->add_option("--policy", extender_args.policy, "binpack or spread")->capture_default_str();
  gpu_extender
      ->add_option("--node-url", extender_args.node_url, "Each node's card state; {node} and {address} are replaced")
      ->capture_default_str();
  gpu_extender->add_option("--fetch-timeout", extender_args.fetch_timeout, "Seconds to wait for a node's state")
      ->capture_default_str();
  gpu_extender->add_option("--cache-seconds", extender_args.cache_seconds, "How long a node's state is reused")
      ->capture_default_str();

  auto* tokenize = app.add_subcommand("tokenize",
                                      "Tokenize text (.jsonl, .txt, either compressed, .parquet, a packed dataset's "
                                      "captions) into a Megatron dataset with a Hugging Face "
                                      "tokenizer.json (stoker tokenize --help for its options)");
  tokenize->prefix_command();
  tokenize->set_help_flag();  // --help goes to the tokenizer's own parser
  DoctorArgs doctor_args;
  auto* doctor = app.add_subcommand(
      "doctor",
      "Run a training command with the doctor attached; print where each step's time went and what to change");
  doctor->add_option("--out", doctor_args.out, "Where reports and traces go (default: a new temporary folder)");
  doctor->add_option("--prometheus-port", doctor_args.prometheus_port,
                     "Serve each process's metrics (Prometheus text) on this port plus its local rank");
  doctor->add_option("COMMAND", doctor_args.command, "The command and its arguments (after --)")->required();
  doctor->positionals_at_end();

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForAllHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    // One line in the documented format, exit status 1 (CLI11 would print
    // its own format and exit with its own codes).
    std::string what = e.what();
    std::replace(what.begin(), what.end(), '\n', ' ');
    const std::vector<std::string> args(argv + 1, argv + argc);
    return Fail(
        stoker::Status::InvalidArgument(fmt::format("{}{} (see 'stoker --help')", what, UsageHint(app, args, e))));
  }
  if (gpu_run->parsed()) {
    if (gpu_wait_opt->count() > 0) gpu_args.wait = gpu_wait;
    return RunGpuRun(gpu_args);
  }
  if (gpu_ls->parsed()) return RunGpuList(gpu_ledger, gpu_leases, json);
  if (gpu_agent->parsed()) return RunGpuAgent(agent_args);
  if (doctor->parsed()) return RunDoctor(doctor_args);
  if (tokenize->parsed()) return RunTokenize(tokenize->remaining());
  if (gpu_extender->parsed()) return RunGpuExtenderCommand(extender_args);
  if (checkpoint_ls->parsed()) return RunCheckpointList(checkpoint_path, json);
  if (checkpoint_verify->parsed()) return RunCheckpointVerify(checkpoint_path, json);
  if (bench->parsed()) {
    for (const char* name :
         {"--threads", "--dtype", "--size", "--eval", "--no-verify", "--on-corrupt", "--shard-window"})
      if (bench->get_option(name)->count() > 0) bench_args.image_options_given.emplace_back(name);
    return RunBench(bench_args);
  }
  if (cache_stat->parsed() || cache_clear->parsed()) return RunCacheStatOrClear(cache_clear->parsed(), remote, json);
  if (cache_warm->parsed()) return RunCacheWarm(dataset, remote, json);
  if (pack->parsed())
    return RunPack({source, out, shard_size, threads, force, max_side, quality,
                    shuffle ? std::optional<std::uint64_t>(shuffle_seed) : std::nullopt, file_columns, seekable_jpeg,
                    keep_bad_images});
  if (index->parsed()) return RunIndex(shards, index_output, force, index_keep_bad_images);
  if (merge->parsed()) return RunMerge(merge_parts, merge_output, force);
  if (inspect->parsed()) return RunInspect(dataset, remote, json, survey_images, seq_len);
  if (verify->parsed()) return RunVerify(dataset, remote, json, decode, token_verify);
  if (list->parsed()) return RunList(dataset, remote, json);
  return kExitError;
}
