"""`stoker gpu run` and `stoker gpu ls` end to end, on the fake driver
(tests/share/fake_cuda.cc) and the share probe, which uses it as programs
do. Skipped where the interposer is not built (no CUDA headers)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
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
               STOKER_GPU_LEASES=str(tmp_path / "leases.json"),
               LD_LIBRARY_PATH="%s:%s:%s" % (fake / "cuda-current", fake / "nvml", fake / "probe"))
    ledger = "/dev/shm/stoker-ledger-py-" + tag
    made = []  # fake nodes' state files (fake_node)
    yield {"env": env, "ledger": ledger, "probe": str(fake / "probe" / "share_probe"), "bin": stoker_bin,
           "fake": fake, "leases": env["STOKER_GPU_LEASES"], "made": made}
    for path in (env["FAKE_GPU_STATE"], ledger, *made):
        if os.path.exists(path):
            os.unlink(path)


def gpu_run(gpu, *args, command):
    ledger = [] if "--ledger" in args else ["--ledger", gpu["ledger"]]
    return subprocess.run([gpu["bin"], "gpu", "run", *ledger, *args, "--", *command],
                          capture_output=True, text=True, env=gpu["env"], timeout=60)


def test_a_command_is_held_to_its_quota_and_says_so(gpu):
    r = gpu_run(gpu, "--memory", "1GiB", "--tenant", "team-a", command=[gpu["probe"], "visible", "--big", "2147483648"])
    assert r.returncode == 0, r.stderr
    assert "stoker gpu run: tenant team-a on GPU-10111213-1415-1617-1819-1a1b1c1d1e1f: 1.0 GiB per GPU" in r.stderr
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
                               text=True, env=gpu["env"], timeout=30)
            assert r.returncode == 0, r.stderr
            view = json.loads(r.stdout)
            # The tenant is in the ledger a moment before its process is, and the process a moment before
            # its first device charge (an empty list): wait for all three.
            tenants = view["tenants"]
            charged = tenants[0]["processes"][0]["charged"] if tenants and tenants[0]["processes"] else []
            if charged and charged[0] > 0 or time.time() > deadline:
                break
            time.sleep(0.1)
        (tenant,) = view["tenants"]
        assert tenant["name"] == "team-b" and tenant["compute_share"] == 50
        assert tenant["devices"][0]["quota"] == 2 << 30
        assert tenant["processes"][0]["pid"] == proc.pid
        assert 0 < tenant["devices"][0]["charged"] <= 2 << 30
        text = subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"]], capture_output=True, text=True,
                              env=gpu["env"])
        assert "team-b" in text.stdout and "2.0 GiB" in text.stdout and "50%" in text.stdout
    finally:
        proc.kill()
        proc.wait()
    # The killed process is gone from the ledger the next time it is read.
    view = json.loads(subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"], "--json"],
                                     capture_output=True, text=True, env=gpu["env"]).stdout)
    assert view["tenants"] == []


def test_ls_counts_each_cards_compute_turns(gpu):
    # Two tenants at 30% and 70%, both launching for a second: the card changes hands, and `ls` says how often.
    runs = [subprocess.Popen([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--compute", share, "--tenant",
                              "turns-" + share, "--no-place", "--quiet", "--", gpu["probe"], "compute"],
                             env=dict(gpu["env"], PROBE_SECONDS="1000", PROBE_KERNEL_US="1000"),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for share in ("30", "70")]
    for r in runs:
        _, err = r.communicate(timeout=60)
        assert r.returncode == 0, err
    view = json.loads(subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"], "--json"],
                                     capture_output=True, text=True, env=gpu["env"], timeout=30).stdout)
    (device,) = view["devices"]
    # Each tenant had turns (46-66 here), each at least 5 ms long (a twentieth of the 100 ms period) unless its
    # work was done: ending them whenever a probe waited on its own kernels gave 257-269.
    assert 2 <= device["turns_granted"] <= 200, device
    assert device["stuck_takeovers"] == 0, device


def test_ls_reads_the_ledger_that_STOKER_GPU_LEDGER_names(gpu):
    env = dict(gpu["env"], STOKER_GPU_LEDGER=gpu["ledger"])
    proc = subprocess.Popen([gpu["bin"], "gpu", "run", "--memory", "2GiB", "--tenant", "by-env", "--quiet", "--",
                             gpu["probe"], "churn", "--bytes", "100000000"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.time() + 20
        while True:
            r = subprocess.run([gpu["bin"], "gpu", "ls", "--json"], capture_output=True, text=True, env=env, timeout=30)
            assert r.returncode == 0, r.stderr
            view = json.loads(r.stdout)
            if view["tenants"] or time.time() > deadline:
                break
            time.sleep(0.1)
        assert view["ledger"] == gpu["ledger"]
        assert [t["name"] for t in view["tenants"]] == ["by-env"]
    finally:
        proc.kill()
        proc.wait()


def test_a_quota_on_a_card_the_command_does_not_see_is_refused(gpu, tmp_path):
    env = fake_node(gpu, devices=1)
    marker = tmp_path / "ran"
    r = subprocess.run([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--device-memory", "5=1GiB", "--",
                        "touch", str(marker)], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 1 and not marker.exists()
    assert "--device-memory 5=1.0 GiB: the command sees 1 GPU(s) (ordinals 0-0), so GPU 5 does not exist" in r.stderr, \
        r.stderr
    # Set by hand (or where the CLI cannot list the cards): the interposer refuses it at cuInit.
    interposer = pathlib.Path(gpu["bin"]).parent / "lib" / "libstoker-share.so"
    env = dict(env, LD_PRELOAD=str(interposer), STOKER_GPU_LEDGER=gpu["ledger"], STOKER_GPU_MEMORY_LIMIT_5="1GiB")
    r = subprocess.run([gpu["probe"], "alloc"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode != 0
    assert ("stoker-share: error: STOKER_GPU_MEMORY_LIMIT_5 sets a quota on device 5, but this process sees 1 "
            "device(s)") in r.stderr, r.stderr
    # The same for a compute share on a card it does not see.
    env.pop("STOKER_GPU_MEMORY_LIMIT_5")
    r = subprocess.run([gpu["probe"], "alloc"], capture_output=True, text=True,
                       env=dict(env, STOKER_GPU_COMPUTE_SHARE_3="20"), timeout=60)
    assert r.returncode != 0
    assert ("stoker-share: error: STOKER_GPU_COMPUTE_SHARE_3 sets a compute share on device 3, but this process "
            "sees 1 device(s)") in r.stderr, r.stderr


def as_user(uid, *command):
    return ["setpriv", "--reuid", str(uid), "--regid", str(uid), "--clear-groups", *command]


def two_users_node(gpu, name):
    """A state folder of its own (each user's ledger and leases there, no file named by hand) and the fake
    device made writable by both users' processes: (folder, environment)."""
    state = "/dev/shm/stoker-gpu-%s-%d-%d" % (name, os.getpid(), time.monotonic_ns())
    env = {k: v for k, v in gpu["env"].items() if k not in ("STOKER_GPU_LEASES", "STOKER_GPU_LEDGER")}
    env["STOKER_GPU_DIR"] = state
    with open(env["FAKE_GPU_STATE"], "wb"):
        pass
    os.chmod(env["FAKE_GPU_STATE"], 0o666)
    return state, env


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to act as two users")
def test_two_users_share_a_node_without_refusing_or_touching_each_other(gpu):
    state, env = two_users_node(gpu, "two-users")
    first = subprocess.Popen(as_user(1001, gpu["bin"], "gpu", "run", "--memory", "1GiB", "--tenant", "team", "--quiet",
                                     "--", gpu["probe"], "churn", "--bytes", "100000000"),
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        ledger_1001 = os.path.join(state, "ledger-uid1001")
        deadline = time.time() + 20
        while not os.path.exists(ledger_1001) and time.time() < deadline:
            time.sleep(0.05)
        # The second user, the same tenant name: a tenant of their own, held to their own quota.
        r = subprocess.run(as_user(1002, gpu["bin"], "gpu", "run", "--memory", "2GiB", "--tenant", "team", "--",
                                   gpu["probe"], "visible", "--big", str(3 << 30)),
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        out = json.loads(r.stdout.strip().splitlines()[-1])
        assert out["quota"] == 2 << 30 and out["big"] == 2 and out["small"] == 0
        st = os.stat(state)
        assert st.st_mode & 0o7777 == 0o1777, oct(st.st_mode)
        for uid in (1001, 1002):
            st = os.stat(os.path.join(state, "ledger-uid%d" % uid))
            assert (st.st_uid, st.st_mode & 0o777) == (uid, 0o600)
        st = os.stat(os.path.join(state, "leases-uid1001.json"))
        assert st.st_uid == 1001
        # Neither may open the other's ledger or leases for writing.
        for path in (ledger_1001, os.path.join(state, "leases-uid1001.json")):
            probe = subprocess.run(as_user(1002, sys.executable, "-c", "open(%r, 'r+b')" % path), capture_output=True,
                                   text=True)
            assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe.stderr
        # Root sees both users' tenants; a user sees their own and is told of the others.
        view = json.loads(subprocess.run([gpu["bin"], "gpu", "ls", "--json"], capture_output=True, text=True,
                                         env=env, check=True).stdout)
        assert sorted((t["name"], t["uid"]) for t in view["tenants"]) == [("team", 1001)]  # 1002's run has ended
        assert view["tenants"][0]["devices"][0]["quota"] == 1 << 30
        mine = subprocess.run(as_user(1002, gpu["bin"], "gpu", "ls"), capture_output=True, text=True, env=env)
        assert mine.returncode == 0, mine.stderr
        assert "1 other user(s)' ledger(s) not readable by you" in mine.stdout, mine.stdout
    finally:
        first.kill()
        first.wait()
        shutil.rmtree(state, ignore_errors=True)


def test_a_ledger_another_user_made_under_your_name_is_refused(gpu):
    state = "/dev/shm/stoker-gpu-squat-%d-%d" % (os.getpid(), time.monotonic_ns())
    os.mkdir(state)
    os.chmod(state, 0o1777)
    try:
        squatted = os.path.join(state, "ledger-uid%d" % os.getuid())
        with open(squatted, "wb"):
            pass
        os.chown(squatted, os.getuid() + 4242, -1) if os.geteuid() == 0 else pytest.skip("needs root to chown")
        env = {k: v for k, v in gpu["env"].items() if k != "STOKER_GPU_LEDGER"}
        env.update(STOKER_GPU_DIR=state, LD_PRELOAD=str(pathlib.Path(gpu["bin"]).parent / "lib" / "libstoker-share.so"))
        r = subprocess.run([gpu["probe"], "alloc"], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode != 0
        assert "the ledger '%s' belongs to uid %d, not to this user" % (squatted, os.getuid() + 4242) in r.stderr, \
            r.stderr
    finally:
        shutil.rmtree(state, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="needs root for a mount namespace")
def test_a_cleared_environment_cannot_escape_the_pinned_limits(gpu, tmp_path):
    """/etc/ld.so.preload names the interposer and /etc/stoker/gpu-limits pins
    1 GiB (as the device plugin's --enforce-preload sets a container up), in a
    mount namespace of the test's own: a program started through `env -i`,
    which drops LD_PRELOAD and every STOKER_GPU_* variable, is held anyway,
    and one that asks for more in its environment gets no more."""
    interposer = pathlib.Path(gpu["bin"]).parent / "lib" / "libstoker-share.so"
    keep = "LD_LIBRARY_PATH=%s FAKE_GPU_STATE=%s" % (gpu["env"]["LD_LIBRARY_PATH"], gpu["env"]["FAKE_GPU_STATE"])
    script = """set -e
cp -a /etc/. "$ROOT/etc/"
mkdir -p "$ROOT/etc/stoker"; chmod 755 "$ROOT/etc/stoker"
printf 'STOKER_GPU_MEMORY_LIMIT=1GiB\\nSTOKER_GPU_TENANT=pinned\\nSTOKER_GPU_LEDGER=%s\\n' "$LEDGER" > "$ROOT/etc/stoker/gpu-limits"
echo "$INTERPOSER" > "$ROOT/etc/ld.so.preload"
mount --bind "$ROOT/etc" /etc
env -i $KEEP "$PROBE" visible --big 2147483648
env -i $KEEP STOKER_GPU_MEMORY_LIMIT=64GiB STOKER_GPU_TENANT=escape "$PROBE" visible --big 2147483648
"""
    (tmp_path / "etc").mkdir()
    env = dict(os.environ, ROOT=str(tmp_path), LEDGER=gpu["ledger"], INTERPOSER=str(interposer), KEEP=keep,
               PROBE=gpu["probe"])
    r = subprocess.run(["unshare", "--mount", "sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    runs = [json.loads(line) for line in r.stdout.splitlines() if line.startswith("{")]
    assert len(runs) == 2, r.stdout
    for out in runs:
        assert out["quota"] == 1 << 30 and out["big"] == 2 and out["small"] == 0, out
    assert not os.path.exists("/etc/ld.so.preload") or "stoker" not in open("/etc/ld.so.preload").read()


def test_ls_names_a_process_on_a_card_without_the_interposer_as_unlimited(gpu):
    env = fake_node(gpu, devices=1)
    bare = subprocess.Popen([gpu["probe"], "churn", "--bytes", "100000000"], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    held = subprocess.Popen([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--no-place", "--memory", "1GiB",
                             "--quiet", "--", gpu["probe"], "churn", "--bytes", "100000000"], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 20
        while True:
            view = gpu_ls(gpu, env)
            seen = {p["pid"]: p["under_interposer"] for p in view["cards"][0]["processes"]}
            if len(seen) == 2 or time.time() > deadline:
                break
            time.sleep(0.05)
        assert seen == {bare.pid: False, held.pid: True}
        text = subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"]], capture_output=True, text=True,
                              env=env).stdout
        assert "pid %d uses" % bare.pid in text and "without the GPU interposer: unlimited" in text, text
        assert "pid %d uses" % held.pid not in text
    finally:
        for p in (bare, held):
            p.kill()
            p.wait()


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="the agent runs as root")
def test_the_agent_takes_the_state_folder_back_and_logs_unlimited_processes(gpu):
    state = "/dev/shm/stoker-gpu-agent-%d-%d" % (os.getpid(), time.monotonic_ns())
    env = dict(fake_node(gpu, devices=1), STOKER_GPU_DIR=state)
    agent = [gpu["bin"], "gpu", "agent"]
    try:
        # A user made the folder first, as their own and not sticky: they could replace everyone's files.
        os.mkdir(state, 0o755)
        os.chown(state, 1001, 1001)
        r = subprocess.run(agent + ["--once"], capture_output=True, text=True, env=env, timeout=30)
        assert r.returncode == 0, r.stderr
        assert "took %s over from uid 1001" % state in r.stderr and "mode 755 -> 1777" in r.stderr, r.stderr
        st = os.stat(state)
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o1777)
        st = os.stat(os.path.join(state, "turns"))  # the agent's to write: users ask it for turns
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o644)
        assert "start `stoker gpu agent` without --once" in r.stderr, r.stderr
        again = subprocess.run(agent + ["--once"], capture_output=True, text=True, env=env, timeout=30)
        assert "already in order" in again.stderr, again.stderr
        r = subprocess.run(as_user(1001, *agent, "--once"), capture_output=True, text=True, env=env, timeout=30)
        assert r.returncode == 1 and "run it as root" in r.stderr
        # Watching: a process on a card without the interposer is named once.
        watcher = subprocess.Popen(agent + ["--interval", "0.1"], env=env, stderr=subprocess.PIPE, text=True)
        bare = subprocess.Popen([gpu["probe"], "churn", "--bytes", "100000000"], env=env, stdout=subprocess.DEVNULL)
        time.sleep(1.5)
        bare.kill()
        bare.wait()
        watcher.send_signal(signal.SIGTERM)
        log = watcher.communicate(timeout=30)[1]
        assert watcher.returncode == 0, log
        assert log.count("pid %d uses" % bare.pid) == 1 and "without the GPU interposer: unlimited" in log, log
        assert log.rstrip().endswith("stopped"), log
    finally:
        shutil.rmtree(state, ignore_errors=True)
    os.symlink("/tmp", state)
    try:
        r = subprocess.run(agent + ["--once"], capture_output=True, text=True, env=env, timeout=30)
        assert r.returncode == 1 and "is a symbolic link, not a folder" in r.stderr, r.stderr
    finally:
        os.unlink(state)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("setpriv"), reason="needs root to act as two users")
def test_two_users_take_turns_through_the_agent_and_neither_can_write_the_schedule(gpu):
    state, env = two_users_node(gpu, "turns")
    turns, socket_path = os.path.join(state, "turns"), os.path.join(state, "turns.sock")

    def start_agent():
        agent = subprocess.Popen([gpu["bin"], "gpu", "agent", "--interval", "0.5"], env=env, stderr=subprocess.PIPE,
                                 text=True)
        deadline = time.time() + 20
        while not os.path.exists(socket_path) and time.time() < deadline and agent.poll() is None:
            time.sleep(0.05)
        return agent

    def stop_agent(agent):
        agent.send_signal(signal.SIGTERM)
        log = agent.communicate(timeout=30)[1]
        assert agent.returncode == 0, log
        return log

    agent = start_agent()
    runs = []
    try:
        assert os.path.exists(socket_path), "the agent serves no turns"
        st = os.stat(turns)
        assert (st.st_uid, st.st_mode & 0o7777) == (0, 0o644)
        # Nobody but the agent may write the schedule.
        probe = subprocess.run(as_user(1001, sys.executable, "-c", "open(%r, 'r+b')" % turns), capture_output=True,
                               text=True)
        assert probe.returncode != 0 and "Permission denied" in probe.stderr, probe.stderr
        # Two users, the same tenant name, 30% and 70%: each asks the agent, as a tenant of its own; a third
        # with a memory quota only takes turns beside them, through the agent too.
        for uid, limit in ((1001, ["--compute", "30"]), (1002, ["--compute", "70"]), (1003, ["--memory", "1GiB"])):
            runs.append(subprocess.Popen(
                as_user(uid, gpu["bin"], "gpu", "run", *limit, "--tenant", "team", "--no-place",
                        "--quiet", "--", gpu["probe"], "compute"),
                env=dict(env, PROBE_SECONDS="4000", PROBE_KERNEL_US="1000"), stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True))
        time.sleep(1.5)
        with open(turns, "rb") as f:
            names = f.read()
        assert b"team@uid1001\0" in names and b"team@uid1002\0" in names and b"team@uid1003\0" in names
        # The agent stops for a while: launches wait (never unlimited), and go on when it is back.
        log = stop_agent(agent)
        time.sleep(0.5)
        agent = start_agent()
        outs = [r.communicate(timeout=60) for r in runs]
        for r, (out, err) in zip(runs, outs):
            assert r.returncode == 0, err
            assert "does not answer" in err and "answers again" in err, err
        assert all("launches under a compute share wait" in err for _, err in outs[:2]), outs
        # Without a share, the process waits for no turn while the agent is away.
        assert "launches without turns until it does" in outs[2][1], outs[2][1]
        seconds = [json.loads(out.strip().splitlines()[-1])["device_seconds"] for out, _ in outs]
        assert seconds[2] > 0.1, seconds
        # The split itself is measured in the C++ suite, alone on the machine; here, both ran, the 70% more.
        assert all(s > 0.1 for s in seconds) and seconds[0] < seconds[1], seconds
        assert "refused" not in log, log
        assert stop_agent(agent).rstrip().endswith("stopped")
    finally:
        for r in runs:
            if r.poll() is None:
                r.kill()
                r.wait()
        if agent.poll() is None:
            agent.kill()
            agent.wait()
        shutil.rmtree(state, ignore_errors=True)


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


# --- placement: choosing the card, the lease file -------------------------------------------------------------------

def fake_node(gpu, **settings):
    """The fixture's environment for a fake node of its own: FAKE_GPU_DEVICES, FAKE_GPU_MEMORY, FAKE_GPU_NUMA."""
    env = dict(gpu["env"], FAKE_GPU_STATE=gpu["env"]["FAKE_GPU_STATE"] + "-" + str(time.monotonic_ns()))
    env.update({"FAKE_GPU_" + k.upper(): str(v) for k, v in settings.items()})
    gpu["made"].append(env["FAKE_GPU_STATE"])  # removed with the fixture
    return env


def gpu_ls(gpu, env=None):
    r = subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"], "--json"], capture_output=True, text=True,
                       env=env or gpu["env"], timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def show_env(*names):
    return ["sh", "-c", "; ".join('echo %s=${%s-unset}' % (n, n) for n in names)]


def parse_env(stdout):
    return dict(line.split("=", 1) for line in stdout.strip().splitlines() if "=" in line)


def test_the_inventory_comes_from_nvml_and_else_from_the_driver(gpu):
    env = fake_node(gpu, devices=3, memory="8589934592,17179869184,17179869184", numa="0,1,1")
    view = gpu_ls(gpu, env)
    assert view["inventory"] == "NVML"
    assert [c["total_bytes"] for c in view["cards"]] == [8 << 30, 16 << 30, 16 << 30]
    assert [c["numa_node"] for c in view["cards"]] == [0, 1, 1]
    assert all(c["uuid"].startswith("GPU-") and c["healthy"] for c in view["cards"])
    without_nvml = dict(env, LD_LIBRARY_PATH=str(gpu["fake"] / "cuda-current"))
    view = gpu_ls(gpu, without_nvml)
    assert view["inventory"] == "CUDA driver"
    assert [c["total_bytes"] for c in view["cards"]] == [8 << 30, 16 << 30, 16 << 30]
    assert all(c["used_bytes"] is None for c in view["cards"]), "the driver is not asked for use (no context)"
    nothing = dict(env, LD_LIBRARY_PATH="/nonexistent")
    view = gpu_ls(gpu, nothing)
    assert "no GPU found" in view["inventory_error"] and view["cards"] == []


def test_a_command_is_placed_on_a_card_and_held_to_its_quota_there(gpu):
    env = fake_node(gpu, devices=2)
    r = subprocess.run([gpu["bin"], "gpu", "run", "--ledger", gpu["ledger"], "--memory", "1GiB", "--", gpu["probe"],
                        "visible", "--big", "2147483648"], capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert " on GPU-10111213-1415-1617-1819-1a1b1c1d1e1f: 1.0 GiB per GPU" in r.stderr, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["quota"] == 1 << 30 and out["big"] == 2
    r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--quiet", "--",
                        *show_env("CUDA_VISIBLE_DEVICES", "STOKER_GPU_TENANT", "STOKER_GPU_LEASE")],
                       capture_output=True, text=True, env=env, timeout=60)
    seen = parse_env(r.stdout)
    assert seen["CUDA_VISIBLE_DEVICES"] == "GPU-10111213-1415-1617-1819-1a1b1c1d1e1f"
    assert seen["STOKER_GPU_TENANT"] == "lease-" + seen["STOKER_GPU_LEASE"]


def test_binpack_stacks_and_spread_spreads(gpu):
    env = fake_node(gpu, devices=3)
    holders = []
    try:
        placed = []
        for policy in ["binpack", "binpack", "spread", "spread"]:
            p = subprocess.Popen([gpu["bin"], "gpu", "run", "--memory", "3GiB", "--policy", policy, "--quiet", "--",
                                  "sh", "-c", "echo $CUDA_VISIBLE_DEVICES; exec sleep 30"], env=env,
                                 stdout=subprocess.PIPE, text=True)
            holders.append(p)
            placed.append(p.stdout.readline().strip())
        cards = [c["uuid"] for c in gpu_ls(gpu, env)["cards"]]
        # binpack: both on card 0; spread: the emptiest cards, 1 then 2.
        assert placed == [cards[0], cards[0], cards[1], cards[2]]
        view = gpu_ls(gpu, env)
        assert [c["leases"] for c in view["cards"]] == [2, 1, 1]
        assert [c["leased_bytes"] for c in view["cards"]] == [6 << 30, 3 << 30, 3 << 30]
        assert len(view["leases"]) == 4 and {l["pid"] for l in view["leases"]} == {p.pid for p in holders}
        text = subprocess.run([gpu["bin"], "gpu", "ls", "--ledger", gpu["ledger"]], capture_output=True, text=True,
                              env=env).stdout
        assert "cards (NVML)" in text and "leases" in text and "sleep 30" in text
    finally:
        for p in holders:
            p.kill()
            p.wait()
    assert gpu_ls(gpu, env)["leases"] == [], "the killed commands' leases are reclaimed"


def test_several_cards_stay_on_one_numa_node_and_one_pcie_switch(gpu):
    # 4 cards: NUMA 0 = {0, 1}, NUMA 1 = {2, 3}; 2 and 3 share a PCIe switch; card 2 has a lease already.
    env = fake_node(gpu, devices=4, numa="0,0,1,1", switch="7,8,9,9")
    cards = [c["uuid"] for c in gpu_ls(gpu, env)["cards"]]
    holder = subprocess.Popen([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--quiet", "--", "sh", "-c",
                               "echo $CUDA_VISIBLE_DEVICES; exec sleep 30"], env=dict(env, CUDA_VISIBLE_DEVICES="2"),
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == cards[2]
        r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--gpus", "2", "--quiet", "--",
                            *show_env("CUDA_VISIBLE_DEVICES")], capture_output=True, text=True, env=env, timeout=60)
        assert parse_env(r.stdout)["CUDA_VISIBLE_DEVICES"] == cards[2] + "," + cards[3], r.stderr
        r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--gpus", "2", "--policy", "spread",
                            "--quiet", "--", *show_env("CUDA_VISIBLE_DEVICES")], capture_output=True, text=True,
                           env=env, timeout=60)
        # One switch beats the emptier node: locality comes before the policy's score.
        assert parse_env(r.stdout)["CUDA_VISIBLE_DEVICES"] == cards[2] + "," + cards[3], r.stderr
        view = gpu_ls(gpu, env)
        assert view["cards"][2]["link_levels"] == [50, 50, 0, 10]
    finally:
        holder.kill()
        holder.wait()


def test_eight_concurrent_runs_never_double_book(gpu):
    env = fake_node(gpu, devices=2)  # 16 GiB each: two 6 GiB commands per card
    procs = [subprocess.Popen([gpu["bin"], "gpu", "run", "--memory", "6GiB", "--quiet", "--", "sh", "-c",
                               "echo $CUDA_VISIBLE_DEVICES; exec sleep 30"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(8)]
    try:
        placed, refused = [], []
        for p in procs:
            line = p.stdout.readline().strip()
            if line:
                placed.append(line)
            else:
                p.wait(timeout=30)
                refused.append(p.stderr.read())
        assert len(placed) == 4 and len(refused) == 4, (placed, refused)
        assert sorted(placed.count(u) for u in set(placed)) == [2, 2]
        assert all("does not fit now" in e and "4.0 GiB of 16.0 GiB free" in e for e in refused), refused
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_whole_cards_and_waiting_for_room(gpu):
    env = fake_node(gpu, devices=2)
    holder = subprocess.Popen([gpu["bin"], "gpu", "run", "--gpus", "2", "--", "sh", "-c",
                               "echo $CUDA_VISIBLE_DEVICES; exec sleep 30"], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert len(holder.stdout.readline().strip().split(",")) == 2
        r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--", "true"], capture_output=True,
                           text=True, env=env, timeout=60)
        assert r.returncode == 1 and "leased whole" in r.stderr, r.stderr
        start = time.monotonic()
        r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--wait", "1", "--", "true"],
                           capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 1 and "deadline exceeded: waited 1 s" in r.stderr, r.stderr
        assert time.monotonic() - start < 10
        waiter = subprocess.Popen([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--wait", "--quiet", "--",
                                   "sh", "-c", "echo $CUDA_VISIBLE_DEVICES"], env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True)
        time.sleep(0.5)
        assert waiter.poll() is None, "it waits while both cards are leased whole"
        holder.kill()
        out, err = waiter.communicate(timeout=30)
        assert waiter.returncode == 0 and out.strip().startswith("GPU-"), err
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("args,says", [
    (["--gpus", "0"], "--gpus must be at least 1"),
    (["--gpus", "-1"], "--gpus"),
    (["--memory", "-5GiB"], "--memory"),
    (["--memory", "1TiB"], "can never fit: the largest card here has 16.0 GiB"),
    (["--gpus", "3"], "asks for more cards than the 2 this node offers"),
    (["--memory", "1GiB", "--policy", "fullest"], "--policy: unknown placement policy 'fullest'"),
    (["--memory", "1GiB", "--wait", "soon"], "--wait 'soon' is not a duration"),
    (["--memory", "1GiB", "--gpus", "2", "--no-place"], "not with --no-place"),
])
def test_bad_requests_are_named_and_nothing_is_leased(gpu, tmp_path, args, says):
    marker = tmp_path / "ran"
    r = subprocess.run([gpu["bin"], "gpu", "run", *args, "--", "touch", str(marker)], capture_output=True, text=True,
                       env=gpu["env"], timeout=60)
    assert r.returncode == 1 and says in r.stderr and r.stderr.startswith("stoker: error:"), r.stderr
    assert not marker.exists()
    assert gpu_ls(gpu)["leases"] == []


def test_a_corrupt_or_newer_lease_file_is_named_and_left_alone(gpu):
    for text, says in [("{not json", "is not a JSON object"),
                       ('{"format": "stoker-gpu-leases", "version": 9, "leases": []}', "lease file version 9")]:
        pathlib.Path(gpu["leases"]).write_text(text)
        r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--", "true"], capture_output=True,
                           text=True, env=gpu["env"], timeout=60)
        assert r.returncode == 1 and gpu["leases"] in r.stderr and says in r.stderr, r.stderr
        assert pathlib.Path(gpu["leases"]).read_text() == text


def test_the_callers_visible_devices_limit_the_choice(gpu):
    env = fake_node(gpu, devices=3)
    cards = [c["uuid"] for c in gpu_ls(gpu, env)["cards"]]
    for visible, expect in [(cards[2], cards[2]), ("1", cards[1])]:
        r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--quiet", "--",
                            *show_env("CUDA_VISIBLE_DEVICES")], capture_output=True, text=True,
                           env=dict(env, CUDA_VISIBLE_DEVICES=visible), timeout=60)
        assert parse_env(r.stdout)["CUDA_VISIBLE_DEVICES"] == expect, r.stderr
    r = subprocess.run([gpu["bin"], "gpu", "run", "--memory", "1GiB", "--", "true"], capture_output=True, text=True,
                       env=dict(env, CUDA_VISIBLE_DEVICES="GPU-nope"), timeout=60)
    assert r.returncode == 1 and "CUDA_VISIBLE_DEVICES names 'GPU-nope'" in r.stderr


# --- Kubernetes: the scheduler extender over HTTP -------------------------------------------------------------------

def test_the_scheduler_extender_answers_kube_scheduler_over_http(stoker_bin, tmp_path):
    import http.server
    import socket
    import threading
    import urllib.request

    def card(uuid, used, compute):
        return {"uuid": uuid, "index": 0, "numa_node": 0, "healthy": True, "total_bytes": 140 << 30,
                "memory_units": 140, "memory_units_used": used, "compute_used": compute, "whole_used": False}
    states = {"gpu-a": [card("GPU-a0", 130, 0)], "gpu-b": [card("GPU-b0", 100, 50), card("GPU-b1", 0, 0)]}
    asked = []

    class NodeState(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append(self.path)
            node = self.path.split("/")[1]
            if node not in states:
                self.send_error(404)
                return
            body = json.dumps({"format": "stoker-node-cards", "version": 1, "node": node, "mode": "shared",
                               "memory_unit_bytes": 1 << 30, "cards": states[node]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    state_server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), NodeState)
    threading.Thread(target=state_server.serve_forever, daemon=True).start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    extender = subprocess.Popen([stoker_bin, "gpu", "scheduler-extender", "--listen", "127.0.0.1:%d" % port,
                                 "--node-url", "http://127.0.0.1:%d/{node}/cards" % state_server.server_port],
                                stderr=subprocess.PIPE, text=True)
    try:
        data = pathlib.Path(os.environ["STOKER_SOURCE_DIR"]) / "tests" / "kube" / "data"
        body = json.loads((data / "filter_nodenames.json").read_text())
        body["nodenames"] = ["gpu-a", "gpu-b", "gpu-gone"]
        deadline = time.time() + 20
        while True:
            try:
                with urllib.request.urlopen("http://127.0.0.1:%d/healthz" % port, timeout=2) as r:
                    assert r.read() == b"ok\n"
                break
            except OSError:
                assert time.time() < deadline and extender.poll() is None, extender.stderr.read()
                time.sleep(0.1)

        def post(verb):
            request = urllib.request.Request("http://127.0.0.1:%d/%s" % (port, verb), data=json.dumps(body).encode(),
                                             headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=10) as r:
                return json.loads(r.read())
        result = post("filter")
        assert result["nodenames"] == ["gpu-b"], result
        assert "10.0 GiB of 140.0 GiB free" in result["failedNodes"]["gpu-a"]
        assert "no card state" in result["failedNodes"]["gpu-gone"] and "HTTP 404" in result["failedNodes"]["gpu-gone"]
        scores = {h["host"]: h["score"] for h in post("prioritize")}
        assert scores == {"gpu-a": 0, "gpu-b": 9, "gpu-gone": 0}
        assert asked.count("/gpu-b/cards") == 1, "filter and prioritize of one pod share a fetch"
    finally:
        extender.terminate()
        _, err = extender.communicate(timeout=10)
        state_server.shutdown()
    assert extender.returncode == 0 and "listening on 127.0.0.1" in err and "stopping" in err, err
    r = subprocess.run([stoker_bin, "gpu", "scheduler-extender", "--node-url", "http://example/cards"],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "names no node" in r.stderr
    plugin = pathlib.Path(stoker_bin).parent / "stoker-device-plugin"
    if plugin.exists():
        r = subprocess.run([stoker_bin, "gpu", "device-plugin", "--mode", "half"], capture_output=True, text=True,
                           timeout=30)
        assert r.returncode == 1 and "--mode 'half': use shared or whole" in r.stderr, r.stderr
    # Without its program beside it (a build without gRPC), the command says what is missing.
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(stoker_bin, alone / "stoker")
    r = subprocess.run([str(alone / "stoker"), "gpu", "device-plugin"], capture_output=True, text=True, timeout=30)
    assert r.returncode == 1 and "stoker-device-plugin, which is not there" in r.stderr, r.stderr
    assert "libgrpc++-dev" in r.stderr


def test_the_kubernetes_manifests_match_the_cli(stoker_bin):
    if not (pathlib.Path(stoker_bin).parent / "stoker-device-plugin").exists():
        pytest.skip("the device plugin is not built here (no gRPC)")
    """deploy/kubernetes: every flag the manifests pass is one the commands accept, and the names and ports agree
    (no cluster runs here; this keeps the manifests in step with the code)."""
    import yaml
    root = pathlib.Path(os.environ["STOKER_SOURCE_DIR"]) / "deploy" / "kubernetes"
    docs = {p.name: list(yaml.safe_load_all(p.read_text())) for p in root.glob("*.yaml")}
    plugin = docs["device-plugin.yaml"][0]["spec"]["template"]["spec"]
    extender = docs["scheduler-extender.yaml"][0]["spec"]["template"]["spec"]
    for spec, command in ((plugin, "device-plugin"), (extender, "scheduler-extender")):
        (container,) = spec["containers"]
        assert container["command"] == ["stoker", "gpu", command]
        help_text = subprocess.run([stoker_bin, "gpu", command, "--help"], capture_output=True, text=True).stdout
        for arg in container["args"]:
            flag = arg.split("=", 1)[0]
            assert flag in help_text, "%s: %s is not an option of stoker gpu %s" % (command, flag, command)
    service = docs["scheduler-extender.yaml"][1]
    config = docs["scheduler-config.yaml"][0]["extenders"][0]
    assert config["urlPrefix"].endswith(":%d" % service["spec"]["ports"][0]["port"])
    assert (config["filterVerb"], config["prioritizeVerb"]) == ("filter", "prioritize")
    managed = {r["name"] for r in config["managedResources"]}
    assert managed == {"stoker.io/gpu-memory", "stoker.io/gpu-compute", "stoker.io/gpu"}
    pod = docs["example-pod.yaml"][0]
    assert set(pod["spec"]["containers"][0]["resources"]["limits"]) <= managed
    mounts = {v["name"]: v["hostPath"]["path"] for v in plugin["volumes"]}
    args = dict(a.split("=", 1) for a in plugin["containers"][0]["args"])
    assert mounts["interposer"] == args["--interposer-host-dir"] and mounts["ledger"] == args["--ledger-host-dir"]
    assert args["--status-address"].endswith(":9453") and "9453" in extender["containers"][0]["args"][2]
