"""What keeps the run's key and weights to the run: the key goes only to a server that proved it holds it, the
run's servers listen on a private Unix socket, cleartext to another machine needs an opt-in, proxies from the
environment never see a loopback request, and the serve command refuses what would leak."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import textwrap
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from omegaconf import OmegaConf

from grpo_rl.config.schema import GRPOConfig
from grpo_rl.engines.served import ServedEngine
from grpo_rl.engines.server import SOCKET_DIR_PREFIX, ServerProcess, ServerSpec, private_socket_dir
from grpo_rl.engines.server_client import ServerClient, model_identity
from grpo_rl.engines.vllm_plugin import KEY_ENV, MODEL_PATH, PROOF_PATH, RequireKey, key_proof
from grpo_rl.errors import ConfigError, RoleFailed
from tests.engine_stand_in import StandIn

KEY = "k" * 43

SQUATTER = textwrap.dedent("""
    import socket, sys
    # Another local user's process: it bound the port first and keeps whatever it is sent.
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    print(s.getsockname()[1], flush=True)
    with open(sys.argv[1], "ab") as out:
        while True:
            conn, _ = s.accept()
            conn.settimeout(2)
            try:
                data = conn.recv(65536)
                out.write(data)
                out.flush()
                conn.sendall(
                    b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\nContent-Length: 2\\r\\n\\r\\n{}"
                )
            except OSError:
                pass
            conn.close()
""")


@pytest.fixture
def squatter(tmp_path):
    """A second process on this machine listening on a loopback port, recording every byte it receives."""
    record = tmp_path / "heard"
    proc = subprocess.Popen([sys.executable, "-c", SQUATTER, str(record)], stdout=subprocess.PIPE, text=True)
    port = int(proc.stdout.readline())
    yield f"http://127.0.0.1:{port}", record
    proc.kill()
    proc.wait()


def test_a_process_that_took_the_port_first_never_reads_the_key(squatter):
    url, record = squatter
    client = ServerClient(url, KEY, timeout=5)
    for _ in range(3):  # the fleet's polls while a server starts
        assert not client.proves_key()
    with pytest.raises(
        RoleFailed,
        match=rf"engine server {url} answers \(HTTP 200\) but is not a server started by "
        r"python -m grpo_rl.cli.serve; start one with",
    ):
        client.get("/health")
    client.close()
    heard = record.read_bytes()
    assert heard.count(PROOF_PATH.encode()) == 4  # it was asked to prove the key, and that is all it heard
    assert KEY.encode() not in heard and b"Authorization" not in heard


def test_the_fleet_starts_servers_on_a_unix_socket_in_a_private_folder(tmp_path, monkeypatch):
    folder = private_socket_dir()
    try:
        mode = folder.stat()
        assert stat.S_IMODE(mode.st_mode) == 0o700 and mode.st_uid == os.getuid()
        assert len(str(folder / "0.00000000.sock")) < 100  # a Unix socket path has at most 107 bytes
        spawned = []
        monkeypatch.setattr(subprocess, "Popen", lambda cmd, **kw: spawned.append(cmd) or _Done())
        server = ServerProcess(
            ServerSpec("m", torch.device("cpu")), key=KEY, log_path=tmp_path / "log", socket_path=folder / "0.sock"
        )
        assert server.url == f"unix:{folder}/0.sock"
        (cmd,) = spawned
        assert cmd[cmd.index("--uds") + 1] == str(folder / "0.sock") and "--port" not in cmd and "--host" not in cmd
        assert KEY not in " ".join(cmd)  # the key is in the environment, never on a command line
    finally:
        folder.rmdir()


class _Done:
    pid = 0

    def poll(self):
        return 0


def test_socket_folders_of_runs_now_gone_are_swept(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", None)
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = tmp_path / f"{SOCKET_DIR_PREFIX}{dead.pid}_abc"
    alive = tmp_path / f"{SOCKET_DIR_PREFIX}{os.getpid()}_def"
    for folder in (stale, alive):
        folder.mkdir()
        (folder / "0.sock").touch()
    planted = tmp_path / f"{SOCKET_DIR_PREFIX}{dead.pid}_link"
    planted.symlink_to(alive)  # never followed
    fresh = private_socket_dir()
    assert fresh.parent == tmp_path and fresh.name.startswith(f"{SOCKET_DIR_PREFIX}{os.getpid()}_")
    assert not stale.exists() and (alive / "0.sock").exists() and planted.is_symlink()


def test_a_server_with_another_key_or_model_is_named_before_the_key_is_sent():
    other = StandIn(key="o" * 43)
    with pytest.raises(
        RoleFailed,
        match=rf"engine server {other.url} was started with another key than the run's: "
        rf"give the run the key the server was started with \({KEY_ENV}\); the key "
        r"was not sent",
    ):
        ServedEngine([other.url], key=KEY, pad_id=0, timeout=5)
    assert [path for path, keyed in other.keyed] == [PROOF_PATH] and not other.keyed[0][1]
    other.close()
    held = {"architectures": ["LlamaForCausalLM"], "vocab_size": 49152, "hidden_size": 960}
    bigger = StandIn(key=KEY, model=held)
    with pytest.raises(
        RoleFailed,
        match=rf"engine server {bigger.url} holds another model than the run's "
        r"\(hidden_size 960 there, 576 in the run's model\): start it with --model",
    ):
        ServedEngine([bigger.url], key=KEY, pad_id=0, timeout=5, model={**held, "hidden_size": 576})
    assert "/update_weight_version" not in [path for path, _ in bigger.calls]  # nothing was changed on it
    ServedEngine([bigger.url], key=KEY, pad_id=0, timeout=5, model=held).shutdown()
    bigger.close()


def test_a_url_that_is_not_a_grpo_rl_server_is_named_in_one_line_without_its_page():
    class Plain(BaseHTTPRequestHandler):  # python -m http.server answers POST with a 501 page
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_error(501, "Unsupported method", "<html><body>" + "x" * 2000 + "</body></html>")

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    import threading

    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{httpd.server_address[1]}"
    with pytest.raises(RoleFailed) as failed:
        ServedEngine([url], key=KEY, pad_id=0, timeout=5)
    message = str(failed.value)
    assert message.startswith(
        f"engine server {url} answers (HTTP 501) but is not a server started by python -m "
        "grpo_rl.cli.serve; start one with: GRPO_RL_ENGINE_KEY=<key> python -m grpo_rl.cli.serve"
    )
    assert "\n" not in message and "html" not in message and len(message) < 300
    httpd.shutdown()
    httpd.server_close()


def test_given_servers_are_checked_in_the_preflight(monkeypatch, tiny_model_dir):
    from grpo_rl.run.preflight import check_given_servers

    monkeypatch.setenv(KEY_ENV, KEY)
    identity = model_identity(str(tiny_model_dir))
    assert identity["architectures"] == ["LlamaForCausalLM"] and identity["hidden_size"] == 64
    good, other = StandIn(key=KEY, model=identity), StandIn(key=KEY, model={**identity, "num_hidden_layers": 30})
    cfg = _cfg(**{"inference_model.engine": "vllm_server", "inference_model.urls": f"[{good.url},{other.url}]"})
    with pytest.raises(
        ConfigError,
        match=rf"inference_model.urls: engine server {other.url} holds another model "
        r"than the run's \(num_hidden_layers 30 there, 2 in the run's model\)",
    ):
        check_given_servers(cfg, str(tiny_model_dir))
    check_given_servers(
        _cfg(**{"inference_model.engine": "vllm_server", "inference_model.urls": f"[{good.url}]"}), str(tiny_model_dir)
    )
    good.close()
    other.close()


def test_proxies_from_the_environment_never_see_a_loopback_request(squatter, monkeypatch):
    proxy, record = squatter
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "ALL_PROXY"):
        monkeypatch.setenv(name, proxy)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    server = StandIn(key=KEY)
    engine = ServedEngine([server.url], key=KEY, pad_id=0, timeout=5)
    assert server.version == "0"  # stamped through the client, not through the proxy
    engine.shutdown()
    server.close()
    assert record.read_bytes() == b""


def test_the_key_middleware_answers_a_proof_and_names_the_model(monkeypatch):
    seen = []

    async def app(scope, receive, send):
        seen.append(scope["type"])
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"ok"})

    monkeypatch.setenv(KEY_ENV, KEY)
    guarded = RequireKey(app)

    def call(scope: dict) -> list[dict]:
        sent = []

        async def send(message):
            sent.append(message)

        asyncio.run(guarded({"headers": [], "query_string": b"", **scope}, None, send))
        return sent

    nonce = "ab" * 16
    answer = call({"type": "http", "path": PROOF_PATH, "query_string": f"nonce={nonce}".encode()})
    assert answer[0]["status"] == 200 and answer[1]["body"] == f'{{"proof": "{key_proof(KEY, nonce)}"}}'.encode()
    assert key_proof(KEY, nonce) != key_proof("x" * 43, nonce) and KEY not in key_proof(KEY, nonce)
    assert call({"type": "http", "path": PROOF_PATH, "query_string": b"nonce=short"})[0]["status"] == 400
    assert call({"type": "http", "path": MODEL_PATH})[0]["status"] == 401  # the model's name needs the key
    config = type("C", (), {"architectures": ["LlamaForCausalLM"], "vocab_size": 7, "hidden_size": 8})
    app_state = type(
        "A",
        (),
        {
            "state": type(
                "S", (), {"vllm_config": type("V", (), {"model_config": type("M", (), {"hf_config": config})})}
            )
        },
    )
    named = call(
        {
            "type": "http",
            "path": MODEL_PATH,
            "app": app_state,
            "headers": [(b"authorization", f"Bearer {KEY}".encode())],
        }
    )
    assert named[1]["body"] == b'{"architectures": ["LlamaForCausalLM"], "vocab_size": 7, "hidden_size": 8}'
    assert call({"type": "websocket", "path": "/v1/realtime"}) == [{"type": "websocket.close", "code": 1008}]
    assert call({"type": "lifespan"}) == [] and seen == ["lifespan"]  # lifespan passes; nothing else reached it


def test_serve_refuses_a_short_key_and_cleartext_beyond_loopback(monkeypatch):
    from grpo_rl.cli.serve import CLEARTEXT_FLAG, check_args, main, vllm_argv

    monkeypatch.setenv(KEY_ENV, "short")
    with pytest.raises(SystemExit, match=f"{KEY_ENV} has 5 characters; use at least 32"):
        main(["--model", "m"])
    assert check_args(["--model", "m"], KEY) is None
    assert check_args(["--model", "m", "--host", "::1"], KEY) is None
    assert "--host 0.0.0.0 would send the key and the weights across the network in cleartext" in check_args(
        ["--model", "m", "--host", "0.0.0.0"], KEY
    )
    assert check_args(["--host", "0.0.0.0", "--ssl-certfile", "c.pem", "--ssl-keyfile", "k.pem"], KEY) is None
    assert check_args(["--host", "0.0.0.0", CLEARTEXT_FLAG], KEY) is None
    assert CLEARTEXT_FLAG not in vllm_argv(["--host", "0.0.0.0", CLEARTEXT_FLAG])
    on_uds = vllm_argv(["--model", "m", "--uds", "/x/s.sock"])
    assert "--host" not in on_uds and "--kv-cache-memory-bytes" not in on_uds
    cpu = vllm_argv(["--model", "m"], on_cpu=True)
    assert cpu[cpu.index("--kv-cache-memory-bytes") + 1] == str(2**30)  # inference_model.kv_cache_gb's default
    given = vllm_argv(["--model", "m", "--kv-cache-memory-bytes", "123"], on_cpu=True)
    assert given.count("--kv-cache-memory-bytes") == 1


def _cfg(**overrides):
    return OmegaConf.merge(
        OmegaConf.structured(GRPOConfig), OmegaConf.from_dotlist([f"{k}={v}" for k, v in overrides.items()])
    )


def test_cleartext_to_another_machine_needs_an_opt_in():
    from grpo_rl.config.checks import check_values

    remote = {"inference_model.engine": "vllm_server", "inference_model.urls": "[http://192.0.2.7:8000]"}
    with pytest.raises(
        ConfigError,
        match=r"inference_model.urls: http://192.0.2.7:8000 is another machine over "
        r"plain http, .* set inference_model.allow_unencrypted_network=true",
    ):
        check_values(_cfg(**remote))
    check_values(_cfg(**remote, **{"inference_model.allow_unencrypted_network": True}))
    for fine in ("https://192.0.2.7:8000", "http://127.0.0.1:8000", "http://localhost:8000", "unix:/run/x.sock"):
        check_values(_cfg(**{**remote, "inference_model.urls": f"[{fine}]"}))
    with pytest.raises(ConfigError, match="inference_model.server_host=0.0.0.0: the run's servers would take the key"):
        check_values(_cfg(**{"inference_model.server_host": "0.0.0.0"}))
    check_values(
        _cfg(
            **{
                "inference_model.server_host": "0.0.0.0",
                "inference_model.ssl_certfile": "c.pem",
                "inference_model.ssl_keyfile": "k.pem",
            }
        )
    )
    with pytest.raises(ConfigError, match="ssl_certfile and inference_model.ssl_keyfile go together"):
        check_values(_cfg(**{"inference_model.ssl_certfile": "c.pem"}))


def test_tls_files_are_checked_before_anything_starts(monkeypatch, tmp_path):
    from grpo_rl.placement.devices import DeviceAllocation
    from grpo_rl.run.preflight import check_engine

    cpu = (torch.device("cpu"),)
    devices = DeviceAllocation(train=cpu, ref=cpu, inference=cpu, reward_model=())
    cfg = _cfg(**{"inference_model.engine": "vllm_server", "inference_model.ssl_ca_certs": str(tmp_path / "ca.pem")})
    with pytest.raises(ConfigError, match=rf"inference_model.ssl_ca_certs={tmp_path}/ca.pem: no such file"):
        check_engine(cfg, devices)
    (tmp_path / "ca.pem").write_text("-----BEGIN CERTIFICATE-----\n")
    check_engine(cfg, devices)


def test_https_servers_are_verified_against_the_given_certificate(tmp_path):
    """A TLS stand-in with a self-signed certificate: refused without its CA, trusted with it."""
    import ssl

    made = subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
            "-keyout",
            str(tmp_path / "key.pem"),
            "-out",
            str(tmp_path / "cert.pem"),
        ],
        capture_output=True,
    )
    if made.returncode != 0:
        pytest.skip(f"openssl could not make a certificate: {made.stderr[-200:]!r}")
    server = StandIn(key=KEY)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp_path / "cert.pem", tmp_path / "key.pem")
    server.httpd.socket = context.wrap_socket(server.httpd.socket, server_side=True)
    url = server.url.replace("http://", "https://")
    with pytest.raises(RoleFailed, match=rf"engine server {url} is not reachable .*CERTIFICATE_VERIFY_FAILED"):
        ServerClient(url, KEY, timeout=5).verify()
    client = ServerClient(url, KEY, timeout=5, ca_certs=str(tmp_path / "cert.pem"))
    client.verify()
    assert client.weight_version() == "default"
    client.close()
    server.close()


def test_an_unsafe_weight_folder_is_refused_before_anything_starts(tmp_path):
    from grpo_rl.placement.devices import DeviceAllocation
    from grpo_rl.run.preflight import check_engine

    cpu = (torch.device("cpu"),)
    devices = DeviceAllocation(train=cpu, ref=cpu, inference=cpu, reward_model=())
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)  # anyone on the machine may plant files in it
    cfg = _cfg(**{"inference_model.engine": "vllm_server", "inference_model.weight_dir": str(shared)})
    with pytest.raises(ConfigError, match=rf"inference_model.weight_dir={shared}: "):
        check_engine(cfg, devices)
    shared.chmod(0o700)
    check_engine(cfg, devices)


def test_a_local_servers_and_an_in_process_engines_groups_stay_on_loopback(monkeypatch):
    """vLLM makes a one-rank gloo group in its process; gloo picks its interface from the host name unless told,
    which on a machine whose name resolves to a LAN address listens there."""
    from grpo_rl.engines.server import server_env
    from grpo_rl.placement.ray import on_loopback

    for name in ("VLLM_HOST_IP", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)
    spec = ServerSpec("m", torch.device("cpu"))
    local = server_env(spec, KEY, base={})
    assert (local["VLLM_HOST_IP"], local["GLOO_SOCKET_IFNAME"], local["NCCL_SOCKET_IFNAME"]) == (
        "127.0.0.1",
        "lo",
        "lo",
    )
    assert "GLOO_SOCKET_IFNAME" not in server_env(spec, KEY, base={}, local=False)  # a server other machines reach
    assert server_env(spec, KEY, base={"GLOO_SOCKET_IFNAME": "eth9"})["GLOO_SOCKET_IFNAME"] == "eth9"  # the user's
    with on_loopback():
        assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and os.environ["VLLM_HOST_IP"] == "127.0.0.1"
    assert "GLOO_SOCKET_IFNAME" not in os.environ and "VLLM_HOST_IP" not in os.environ
