"""`stoker gpu run` and `stoker gpu ls` end to end, on the fake driver
(tests/share/fake_cuda.cc) and the share probe, which uses it as programs
do. Skipped where the interposer is not built (no CUDA headers)."""
import json
import os
import pathlib
import shutil
import subprocess
import time

import pytest


@pytest.fixture()
def gpu(stoker_bin, tmp_path):
    build = pathlib.Path(stoker_bin).parent
    fake = build / "fake-gpu"
    if not (build / "lib" / "libstoker-share.so").exists() or not (fake / "probe" / "share_probe").exists():
        pytest.skip("the GPU interposer is not built here")
    tag = "%d-%d" % (os.getpid(), time.monotonic_ns())
    env = dict(os.environ,
               FAKE_GPU_STATE="/dev/shm/stoker-fake-gpu-py-" + tag,
               LD_LIBRARY_PATH="%s:%s:%s" % (fake / "cuda-current", fake / "nvml", fake / "probe"))
    ledger = "/dev/shm/stoker-ledger-py-" + tag
    yield {"env": env, "ledger": ledger, "probe": str(fake / "probe" / "share_probe"), "bin": stoker_bin}
    for path in (env["FAKE_GPU_STATE"], ledger):
        if os.path.exists(path):
            os.unlink(path)


def gpu_run(gpu, *args, command):
    ledger = [] if "--ledger" in args else ["--ledger", gpu["ledger"]]
    return subprocess.run([gpu["bin"], "gpu", "run", *ledger, *args, "--", *command],
                          capture_output=True, text=True, env=gpu["env"], timeout=60)


def test_a_command_is_held_to_its_quota_and_says_so(gpu):
    r = gpu_run(gpu, "--memory", "1GiB", "--tenant", "team-a", command=[gpu["probe"], "visible", "--big", "2147483648"])
    assert r.returncode == 0, r.stderr
    assert "stoker gpu run: tenant team-a: 1.0 GiB per GPU" in r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["quota"] == 1 << 30
    assert out["big"] == 2, "2 GiB on a 1 GiB quota is CUDA_ERROR_OUT_OF_MEMORY"
    assert out["small"] == 0 and out["process"] == out["fake_used"]


def test_ls_shows_tenants_quotas_use_and_processes(gpu):
    proc = subprocess.Popen([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--memory", "2GiB", "--compute", "50",
                             "--tenant", "team-b", "--quiet", "--", gpu["probe"], "churn", "--bytes", "500000000"],
                            env=gpu["env"], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 20
        while True:
            r = subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"], "--json"], capture_output=True,
                               text=True, timeout=30)
            assert r.returncode == 0, r.stderr
            view = json.loads(r.stdout)
            if view["tenants"] and view["tenants"][0]["processes"][0]["charged"][0] > 0 or time.time() > deadline:
                break
            time.sleep(0.1)
        (tenant,) = view["tenants"]
        assert tenant["name"] == "team-b" and tenant["compute_share"] == 50
        assert tenant["devices"][0]["quota"] == 2 << 30
        assert tenant["processes"][0]["pid"] == proc.pid
        assert 0 < tenant["devices"][0]["charged"] <= 2 << 30
        text = subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"]], capture_output=True, text=True)
        assert "team-b" in text.stdout and "2.0 GiB" in text.stdout and "50%" in text.stdout
    finally:
        proc.kill()
        proc.wait()
    # The killed process is gone from the ledger the next time it is read.
    view = json.loads(subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"], "--json"],
                                     capture_output=True, text=True).stdout)
    assert view["tenants"] == []


@pytest.mark.parametrize("args,says", [
    (["--memory", "lots"], "--memory: 'lots' is not a byte size"),
    (["--memory", "0"], "--memory must be above zero"),
    (["--compute", "0"], "--compute"),
    (["--device-memory", "one=1GiB"], "must be ORDINAL=SIZE"),
    (["--tenant", "a b"], "tenant 'a b' must be 1-63 characters"),
    (["--ledger", "relative/path"], "must be an absolute path"),
])
def test_bad_settings_are_refused_before_anything_runs(gpu, tmp_path, args, says):
    marker = tmp_path / "ran"
    r = gpu_run(gpu, *args, command=["touch", str(marker)])
    assert r.returncode == 1 and says in r.stderr and r.stderr.startswith("stoker: error:"), r.stderr
    assert not marker.exists()


def test_programs_that_would_run_unlimited_are_refused(gpu, tmp_path):
    setuid = tmp_path / "setuid-true"
    shutil.copy("/bin/true", setuid)
    os.chmod(setuid, 0o4755)
    r = gpu_run(gpu, "--memory", "1GiB", command=[str(setuid)])
    assert r.returncode == 1 and "set-user-ID" in r.stderr, r.stderr
    if shutil.which("gcc"):
        source = tmp_path / "static.c"
        source.write_text("int main(void) { return 0; }\n")
        static = tmp_path / "static"
        if subprocess.run(["gcc", "-static", "-o", str(static), str(source)], capture_output=True).returncode == 0:
            r = gpu_run(gpu, "--memory", "1GiB", command=[str(static)])
            assert r.returncode == 1 and "statically linked" in r.stderr, r.stderr
    # A script is judged by its interpreter.
    script = tmp_path / "script.sh"
    script.write_text("#!/usr/bin/env sh\nexit 7\n")
    script.chmod(0o755)
    assert gpu_run(gpu, "--memory", "1GiB", command=[str(script)]).returncode == 7
    r = gpu_run(gpu, "--memory", "1GiB", command=["no-such-command-anywhere"])
    assert r.returncode == 1 and "was not found on PATH" in r.stderr
    env = dict(gpu["env"], STOKER_GPU_INTERPOSER=str(tmp_path / "missing.so"))
    r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--", "true"], capture_output=True, text=True,
                       env=env)
    assert r.returncode == 1 and "STOKER_GPU_INTERPOSER names" in r.stderr, r.stderr


def test_a_process_that_cannot_be_held_fails_instead_of_running_unlimited(gpu):
    # Another process of the tenant set 1 GiB; this one asks for 2 GiB.
    holder = subprocess.Popen([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--memory", "1GiB", "--tenant", "t",
                               "--quiet", "--", gpu["probe"], "churn", "--bytes", "100000000"], env=gpu["env"])
    try:
        time.sleep(0.5)
        r = gpu_run(gpu, "--memory", "2GiB", "--tenant", "t", "--quiet", command=[gpu["probe"], "alloc"])
        assert r.returncode != 0
        assert "stoker-share: error: tenant 't' has a quota of" in r.stderr, r.stderr
        assert "all processes of a tenant must agree" in r.stderr
    finally:
        holder.kill()
        holder.wait()


def test_where_mps_runs_it_applies_the_compute_share(gpu, tmp_path):
    pipe = tmp_path / "mps"
    pipe.mkdir()
    (pipe / "control").write_text("")
    env = dict(gpu["env"], CUDA_MPS_PIPE_DIRECTORY=str(pipe))
    r = subprocess.run([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--compute", "30", "--", "env"],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=30" in r.stdout and "STOKER_GPU_COMPUTE_MODE=mps" in r.stdout
    assert "30% of each GPU's SMs (by MPS)" in r.stderr
    r = subprocess.run([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--compute", "30", "--", "env"],
                       capture_output=True, text=True, env=gpu["env"], timeout=60)
    assert "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE" not in r.stdout and "30% of each GPU's time" in r.stderr
