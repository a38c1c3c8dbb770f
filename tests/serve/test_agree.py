"""``kit agree`` (kit.serve.agree) against a real HTTP server that is cheap: a scripted completions server in a thread
whose tokens come from transformers' own ``generate()`` on the tiny checkpoint (an implementation independent of the
kit's reference loop), answering the way vLLM 0.32 does (``token_ids``, ``token_id:N`` log-prob tokens, per-token
log-probs), or, in text mode, the way ``transformers serve`` does (text prompts only, unknown fields refused, text
back). Disagreements are planted on either side: a token or a log-prob changed by the server at a known position,
and a reference checkpoint whose weights make it leave the server's tokens at a known position.
"""

import json
import shutil
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch
from sse_server import dead_url

from kit import cli
from kit.models import load_checkpoint
from kit.serve.agree import AgreeConfig, agree, first_divergence, token_agreement
from kit.serve.checkpoint import build_tiny_checkpoint
from kit.serve.client import load_tokenizer

PROMPTS = ["the first thing to know about the world is", "a long time ago a young woman"]
N = 8
#: the OpenAI fields a text-only server (transformers serve) takes; anything else is refused with HTTP 422
OPENAI_FIELDS = {"model", "prompt", "max_tokens", "temperature", "logprobs", "stream", "seed", "top_p"}


def save_with_tokenizer(model, src, dst):
    """``model`` saved to ``dst`` with the tokenizer files of checkpoint ``src``; returns ``dst``."""
    model.save_pretrained(dst)
    for f in src.glob("tokenizer*"):
        shutil.copy(f, dst)
    return dst


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    """The tiny checkpoint with an output layer of its own (untied, random): the tied one only repeats the prompt's
    last token, this one walks through the vocabulary, so a position in its output means something."""
    d = tmp_path_factory.mktemp("agree")
    model = load_checkpoint(build_tiny_checkpoint(d / "tiny", hidden_size=64), "float32")
    model.config.tie_word_embeddings = False
    gen = torch.Generator().manual_seed(1)
    model.lm_head.weight = torch.nn.Parameter(torch.randn(model.lm_head.weight.shape, generator=gen) * 0.02)
    return save_with_tokenizer(model, d / "tiny", d / "untied")


class Scripted(ThreadingHTTPServer):
    """The completions server: ``mode`` ``vllm`` | ``logprob_ids`` (ids only in the log-prob tokens) | ``text``;
    ``plant_token`` / ``plant_logprob``: a position whose token (next id) / log-prob (+0.5 nats) is changed."""

    daemon_threads = True

    def __init__(self, ckpt):
        super().__init__(("127.0.0.1", 0), Handler)
        self.model, self.tok = load_checkpoint(ckpt, "float32"), load_tokenizer(str(ckpt))
        self.mode, self.plant_token, self.plant_logprob, self.status, self.bodies = "vllm", None, None, 200, []
        self.url = f"http://127.0.0.1:{self.server_address[1]}"

    def generate(self, ids: list[int], n: int, ignore_eos: bool) -> tuple[list[int], list[float]]:
        out = self.model.generate(
            torch.tensor([ids]), do_sample=False, max_new_tokens=n, min_new_tokens=n if ignore_eos else 0,
            output_logits=True, return_dict_in_generate=True, pad_token_id=self.tok.pad_token_id,
        )  # fmt: skip
        new = out.sequences[0, len(ids) :].tolist()
        lps = [torch.log_softmax(lg[0].float(), -1) for lg in out.logits]
        if self.plant_token is not None:
            new[self.plant_token] = (new[self.plant_token] + 1) % lps[0].shape[0]
        values = [float(lp[t]) for lp, t in zip(lps, new, strict=False)]
        if self.plant_logprob is not None:
            values[self.plant_logprob] += 0.5
        return new, values

    def answer(self, body: dict) -> tuple[int, dict]:
        self.bodies.append(body)
        if self.status != 200:
            return self.status, {"error": "engine on fire"}
        prompt = body["prompt"]
        if self.mode == "text" and not isinstance(prompt, str):
            return 400, {"detail": "prompt must be a string."}
        if self.mode == "text" and set(body) - OPENAI_FIELDS:
            return 422, {"detail": f"Unexpected fields in the request: {set(body) - OPENAI_FIELDS}"}
        ids = self.tok(prompt)["input_ids"] if isinstance(prompt, str) else prompt
        new, values = self.generate(ids, body["max_tokens"], bool(body.get("ignore_eos")))
        choice = {"index": 0, "text": self.tok.decode(new), "finish_reason": "length"}
        if self.mode == "vllm":
            choice["token_ids"] = new
        if self.mode in ("vllm", "logprob_ids"):
            choice["logprobs"] = {"tokens": [f"token_id:{t}" for t in new], "token_logprobs": values}
        return 200, {"object": "text_completion", "choices": [choice]}


class Handler(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, status: int, obj: dict) -> None:
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self.reply(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.reply(*self.server.answer(body))


@pytest.fixture(scope="module")
def server(ckpt):
    srv = Scripted(ckpt)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    yield srv
    srv.shutdown()
    srv.server_close()


@pytest.fixture
def scripted(server):
    server.mode, server.plant_token, server.plant_logprob, server.status = "vllm", None, None, 200
    server.bodies.clear()
    return server


def _agree(srv, ckpt, **kw):
    return agree(PROMPTS, url=srv.url, reference=str(ckpt), max_tokens=N, **kw)


def test_an_honest_server_agrees_token_for_token(scripted, ckpt):
    report = _agree(scripted, ckpt)
    s = report.summary()
    assert report.passed and s["agree_fully"] == 2 and s["first_divergence"] == [None, None]
    assert s["min_agreement"] == s["median_agreement"] == 1.0
    assert 0 <= s["max_logprob_diff"] < 1e-4  # same fp32 model: logits equal to rounding
    assert all(p.ids_source == "token_ids" and len(p.server_ids) == N for p in report.prompts)
    assert report.settings["model"] == "tiny" and report.settings["request_form"] == "ids"  # from /v1/models
    body = scripted.bodies[0]  # greedy, ids in, ids and log-probs asked for, EOS ignored
    assert body["prompt"] == report.prompts[0].prompt_ids and isinstance(body["prompt"][0], int)
    assert body["temperature"] == 0 and body["max_tokens"] == N and body["logprobs"] == 1
    assert body["ignore_eos"] and body["return_token_ids"] and body["return_tokens_as_token_ids"]
    by_ids = agree([[5, 17, 40]], url=scripted.url, reference=str(ckpt), max_tokens=2)  # ids go as they are
    assert scripted.bodies[-1]["prompt"] == [5, 17, 40] and by_ids.prompts[0].prompt_ids == [5, 17, 40]


def test_a_token_the_server_changed_at_position_k_is_reported_at_k(scripted, ckpt, capsys):
    scripted.plant_token = 3
    report = _agree(scripted, ckpt)
    s = report.summary()
    assert s["first_divergence"] == [3, 3] and s["agree_fully"] == 0 and not report.passed
    assert s["min_agreement"] == pytest.approx((N - 1) / N) and s["failed"] == [0, 1]
    p = report.prompts[0]
    assert p.server_ids[:3] == p.reference_ids[:3] and p.server_ids[3] != p.reference_ids[3]
    assert p.divergence_gap > 0  # the reference rates its own token above the server's
    assert _agree(scripted, ckpt, min_agreement=0.8).passed  # 7/8 >= 0.8: position still reported, gate met
    rc = cli.main(["agree", "--url", scripted.url, "--reference", str(ckpt), "--max-tokens", str(N)]
                  + [a for p in PROMPTS for a in ("--prompt", p)])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 1 and "FAIL: prompts [0, 1] (exit 1)" in out and "first divergence per prompt [3, 3]" in out


def test_a_logprob_the_server_changed_is_reported_and_gated(scripted, ckpt, capsys):
    scripted.plant_logprob = 2
    report = _agree(scripted, ckpt)
    assert report.summary()["first_divergence"] == [None, None] and report.passed  # tokens agree; not gated
    assert [p.max_logprob_diff for p in report.prompts] == [pytest.approx(0.5, abs=1e-3)] * 2
    assert not _agree(scripted, ckpt, max_logprob_diff=0.1).passed
    rc = cli.main(["agree", "--url", scripted.url, "--reference", str(ckpt), "--max-tokens", str(N),
                   "--max-logprob-diff", "0.1", "--json"])  # fmt: skip
    doc = json.loads(capsys.readouterr().out)
    assert rc == 1 and doc["summary"]["passed"] is False and doc["summary"]["max_logprob_diff"] > 0.49
    assert len(doc["prompts"]) == 3 and doc["settings"]["max_logprob_diff"] == 0.1  # the built-in prompts


def test_a_reference_that_leaves_the_servers_tokens_at_k_is_reported_at_k(scripted, ckpt, tmp_path):
    # Plant on the reference side: zero the output row of the server's token at the first position k >= 2 whose
    # token is new to the output. Its logit becomes 0 everywhere: at each earlier position the chosen token's logit
    # (the largest of 354, > 0) still wins, at k the token loses to the runner-up. So the perturbed reference
    # follows the server up to k and leaves it at k.
    honest = _agree(scripted, ckpt).prompts[0]
    s = honest.server_ids
    k = next(i for i, t in enumerate(s) if i >= 2 and t not in s[:i])
    model = load_checkpoint(ckpt, "float32")
    with torch.no_grad():
        model.lm_head.weight[s[k]] = 0
    bad = save_with_tokenizer(model, ckpt, tmp_path / "perturbed")
    p = agree(PROMPTS[:1], url=scripted.url, reference=str(bad), max_tokens=N).prompts[0]
    assert p.first_divergence == k and p.server_ids == s, (k, p)
    assert p.reference_ids[:k] == s[:k] and p.reference_ids[k] != s[k]
    assert p.divergence_gap > 0 and not p.passed


def test_ids_from_logprob_tokens_when_there_are_no_token_ids(scripted, ckpt):
    scripted.mode = "logprob_ids"
    report = _agree(scripted, ckpt)
    assert [p.ids_source for p in report.prompts] == ["logprobs"] * 2 and report.passed


def test_a_text_only_server_is_asked_again_with_openai_fields_and_its_text_retokenized(scripted, ckpt):
    scripted.mode = "text"
    report = _agree(scripted, ckpt)
    assert report.settings["request_form"] == "text"
    assert [p.ids_source for p in report.prompts] == ["retokenized"] * 2
    assert isinstance(scripted.bodies[0]["prompt"], list) and scripted.bodies[0]["ignore_eos"]  # refused (400)
    assert all(set(b) <= OPENAI_FIELDS and isinstance(b["prompt"], str) for b in scripted.bodies[1:])
    assert len(scripted.bodies) == 3  # asked once more, then every prompt in the text form
    for p in report.prompts:
        assert p.first_divergence == first_divergence(p.server_ids, p.reference_ids)
        assert p.max_logprob_diff is None  # no log-probs back


def test_a_server_error_is_one_line_naming_the_status(scripted, ckpt, capsys):
    scripted.status = 500
    rc = cli.main(["agree", "--url", scripted.url, "--reference", str(ckpt), "--max-tokens", "2"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "HTTP 500" in err[0] and "engine on fire" in err[0], err


@pytest.mark.parametrize(
    "args,named",
    [
        (["--min-agreement", "1.5"], "--min-agreement 1.5"),
        (["--max-tokens", "0"], "--max-tokens 0"),
        (["--max-logprob-diff", "-1"], "--max-logprob-diff -1"),
        (["--dtype", "fp8"], "'fp8'"),
        (["--timeout-s", "0"], "--timeout-s 0"),
        (["--device", "tpu"], "'tpu'"),
        (["--reference", "/nonexistent/ckpt"], "/nonexistent/ckpt"),
        (["--prompts-file", "/nonexistent/prompts.txt"], "/nonexistent/prompts.txt"),
        (["--prompt", " "], "non-empty"),
    ],
)
def test_bad_input_is_one_line_naming_it(scripted, ckpt, args, named, capsys):
    argv = ["agree", "--url", scripted.url, "--max-tokens", "2", *args]
    argv += [] if "--reference" in args else ["--reference", str(ckpt)]
    try:
        rc = cli.main(argv)
    except SystemExit as e:  # argparse's refusal
        rc = e.code
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and named in err[0], err


def test_a_dead_server_is_one_line(ckpt, capsys):
    rc = cli.main(["agree", "--url", dead_url(), "--reference", str(ckpt)])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "is a server running there?" in err[0], err


def test_divergence_and_agreement_edges():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None and first_divergence([], []) is None
    assert first_divergence([1, 2, 3], [1, 5, 3]) == 1 and first_divergence([1, 2], [1, 2, 3]) == 2
    assert token_agreement([1, 2, 3, 4], [1, 0, 3, 0]) == 0.5 and token_agreement([1, 2], [1, 2, 9]) == 1.0
    assert token_agreement([], []) == 1.0 and token_agreement([], [1]) == 0.0
    with pytest.raises(ValueError, match="unknown option"):
        agree(["x"], AgreeConfig(url="http://127.0.0.1:1"), temprature=0)
    for bad in ([], [""], [[]], [[3, -1]], [[True]], [3]):
        with pytest.raises(ValueError, match="non-empty texts or lists of token ids"):
            agree(bad, url="http://127.0.0.1:1")
