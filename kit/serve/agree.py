"""``kit agree``: does an OpenAI-compatible endpoint generate what its checkpoint generates in-process?

The same prompts go greedily (temperature 0, ``max_tokens`` new tokens, EOS ignored where the server allows it) to
the endpoint's ``/v1/completions`` and through the in-process reference (transformers, the same checkpoint
directory, a chosen dtype). Per prompt: the first position where the two token sequences differ, the token
agreement, and the largest absolute log-prob difference of the tokens the server chose. This is the check for the
"incorrect datatype assumptions" class of bug (a kernel reading bf16 as fp16, a wrong scale, a KV cache in the wrong
dtype): such a server still answers, only with other tokens. Definitions: docs/metrics.md, "Agreement with a
reference".

How the server's token ids are obtained, and why. Re-tokenising the returned text is not the same as the ids the
server generated: a byte-level BPE can merge the decoded pieces differently ("a" + "b" back as "ab"), and a
detokeniser may withhold an incomplete UTF-8 byte, so a correct server could look wrong. So the prompt goes as token
ids (``prompt: [ids]``, which vLLM and SGLang accept: no second tokenisation either) and the generated ids come
back as ids: vLLM's ``return_token_ids`` (``choices[0].token_ids``, vLLM >= 0.10.2) or else its
``return_tokens_as_token_ids`` form of the per-token ``logprobs`` (``"token_id:40"``); vLLM 0.32 returns both (run
against it). The chosen token's log-prob comes from ``logprobs: 1`` (``choices[0].logprobs.token_logprobs``, one per
generated token). ``repetition_penalty: 1`` is sent too: vLLM applies a penalty from the model's
``generation_config.json`` unless the request overrides it, and the reference is a plain argmax. Only a server that
refuses that request (HTTP 400/422: ``transformers serve`` takes a text prompt only and refuses unknown fields) is
asked again with the OpenAI fields alone (text prompt, no ``ignore_eos``; the reference then stops at EOS too), and
its text is re-tokenised with the checkpoint's tokenizer; each prompt's ``ids_source`` says which way its ids came
(``token_ids``, ``logprobs`` or ``retokenized``: only the last can show a divergence that is not the server's).

The reference runs its own greedy loop (argmax of the logits, KV cache) rather than ``generate()``, so no logits
processor of the checkpoint's ``generation_config.json`` applies. Log-probs are compared in the server's own context:
one forward pass over prompt + the server's tokens gives the reference's ``log_softmax`` at every position the
server generated, so a log-prob difference after a divergence still compares like with like.
"""

from __future__ import annotations

import json
import statistics
from dataclasses import asdict, dataclass, field

from kit.cli import config_field, config_with
from kit.dtypes import MODEL_DTYPES, model_dtype
from kit.errors import UserError
from kit.serve.client import DEFAULT_API_KEY_ENV, auth_headers, get_model_id, load_tokenizer
from kit.serve.limits import check_number, check_url
from kit.serve.redact import endpoint_url, redact_url, scrub, secrets_of
from kit.serve.texts import describe_exception, short_error

#: prompts sent when none are given: short, plain English (every tokenizer has these words)
DEFAULT_PROMPTS = (
    "The first thing to know about the world is",
    "A long time ago, in a small place by the sea, a young woman",
    "Here is a list of numbers: one, two, three,",
)
#: exit code of ``kit agree`` when a prompt fails the gate (0: every prompt passed; 2: a user error)
EXIT_DISAGREE = 1
#: longest output asked for per prompt (the reference decodes it token by token)
MAX_AGREE_TOKENS = 4096
#: HTTP statuses that mean "this server does not take that request": ask again with the OpenAI fields only
REFUSED = (400, 422)


@dataclass
class AgreeConfig:
    """What ``kit agree`` compares and when a prompt fails. Each field's help is also the command's option."""

    url: str = config_field("", help="server base URL, e.g. http://127.0.0.1:8000", cli=False)
    model: str | None = config_field(None, help="served model id (default: first of /v1/models)")
    reference: str | None = config_field(
        None, help="local checkpoint directory of the reference (default: the served model id, a local directory)"
    )
    dtype: str = config_field(
        "float32", parse=model_dtype, help=f"dtype the reference runs in: {', '.join(MODEL_DTYPES)} (or bf16, fp16)"
    )
    device: str = config_field("cpu", help="device of the reference: cpu, cuda (cuda:N), rocm or auto")
    max_tokens: int = config_field(16, help="new tokens per prompt, greedy, on both sides")
    ignore_eos: bool = config_field(True, help="ask the server to ignore EOS (and the reference does)")
    min_agreement: float = config_field(
        1.0, help="a prompt whose token agreement is below this fails (1.0: every token must match)"
    )
    max_logprob_diff: float | None = config_field(
        None, help="a prompt whose max |logprob difference| exceeds this (nats) fails (default: not gated)"
    )
    timeout_s: float = config_field(120.0, help="longest wait for one completion, s")
    api_key_env: str = config_field(DEFAULT_API_KEY_ENV, help="environment variable holding the API key")


def check_agree_config(cfg: AgreeConfig) -> AgreeConfig:
    """``cfg`` with its dtype canonical.

    Raises:
        UserError: naming the first bad field, its value and what is allowed (url http(s) with a host; dtype one of
            float32/bfloat16/float16; max_tokens 1-4096; min_agreement 0-1; max_logprob_diff >= 0 or None;
            timeout_s > 0).
    """
    check_url(cfg.url)
    cfg.dtype = model_dtype(cfg.dtype)
    check_number("max_tokens", cfg.max_tokens, lo=1, hi=MAX_AGREE_TOKENS, integer=True)
    check_number("min_agreement", cfg.min_agreement, lo=0, hi=1, meaning="a fraction of positions")
    check_number("max_logprob_diff", cfg.max_logprob_diff, lo=0, allow_none=True, meaning="nats; None: not gated")
    check_number("timeout_s", cfg.timeout_s, lo=0, lo_open=True, meaning="s")
    return cfg


@dataclass
class PromptAgreement:
    """One prompt's comparison. Token lists are ids of the checkpoint's vocabulary; log-probs are in nats.

    Attributes:
        first_divergence: first position (0 = the first new token) where the sequences differ, or where the shorter
            one ends; None when they are equal.
        agreement: fraction of positions equal, over the shorter length (1.0 when both are empty).
        max_logprob_diff: max over the server's positions of abs(server log-prob - reference log-prob) of the server's
            token in the server's context; None when the server returned no log-probs.
        divergence_gap: at ``first_divergence``, the reference's log-prob of its own token minus that of the
            server's token (nats): near 0 a near-tie that rounding can flip, large a token the reference rules out.
        ids_source: how the server's ids were obtained (``token_ids``, ``logprobs``, ``retokenized``).
        passed: agreement >= ``min_agreement`` and (when gated) max_logprob_diff <= ``max_logprob_diff``.
    """

    prompt: str
    prompt_ids: list[int]
    server_ids: list[int]
    reference_ids: list[int]
    ids_source: str
    first_divergence: int | None
    agreement: float
    max_logprob_diff: float | None
    divergence_gap: float | None
    passed: bool
    server_logprobs: list[float | None] = field(default_factory=list, repr=False)


@dataclass
class AgreeReport:
    """Every prompt's :class:`PromptAgreement`, the settings, and the summary (:meth:`summary`)."""

    prompts: list[PromptAgreement]
    settings: dict

    @property
    def passed(self) -> bool:
        """True when every prompt passed the gate."""
        return all(p.passed for p in self.prompts)

    def summary(self) -> dict:
        """Prompts agreeing fully, min/median agreement, first divergence per prompt, the largest log-prob
        difference (nats; None without log-probs), the failing prompts' indices, and ``passed``."""
        agreements = [p.agreement for p in self.prompts]
        diffs = [p.max_logprob_diff for p in self.prompts if p.max_logprob_diff is not None]
        return {
            "prompts": len(self.prompts),
            "agree_fully": sum(p.first_divergence is None for p in self.prompts),
            "min_agreement": min(agreements),
            "median_agreement": statistics.median(agreements),
            "first_divergence": [p.first_divergence for p in self.prompts],
            "max_logprob_diff": max(diffs) if diffs else None,
            "failed": [i for i, p in enumerate(self.prompts) if not p.passed],
            "passed": self.passed,
        }

    def to_json(self) -> dict:
        """One JSON-ready object: ``summary``, ``settings`` and every prompt's fields."""
        return {"summary": self.summary(), "settings": self.settings, "prompts": [asdict(p) for p in self.prompts]}


# ---------------------------------------------------------------- the comparison itself
def first_divergence(a: list[int], b: list[int]) -> int | None:
    """First index where ``a`` and ``b`` differ, or ``min(len)`` when one is a proper prefix of the other; None
    when equal."""
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def token_agreement(a: list[int], b: list[int]) -> float:
    """Fraction of positions where ``a`` and ``b`` hold the same id, over the shorter length (1.0 when both are
    empty, 0.0 when only one is)."""
    n = min(len(a), len(b))
    if n == 0:
        return 1.0 if len(a) == len(b) else 0.0
    return sum(x == y for x, y in zip(a, b, strict=False)) / n


def max_abs_diff(server: list[float | None], reference: list[float | None]) -> float | None:
    """max abs(server[i] - reference[i]) over positions where both are numbers; None when there is no such one."""
    pairs = [(s, r) for s, r in zip(server, reference, strict=False) if s is not None and r is not None]
    return max(abs(s - r) for s, r in pairs) if pairs else None


# ---------------------------------------------------------------- the endpoint
def request_bodies(model: str, prompt_ids: list[int], prompt: str, cfg: AgreeConfig) -> tuple[dict, dict]:
    """``(ids_body, text_body)``: the request with the prompt as ids and vLLM's extensions, and the one with the
    OpenAI fields only (see the module docstring)."""
    plain = {"model": model, "max_tokens": int(cfg.max_tokens), "temperature": 0.0, "logprobs": 1}
    ids = {
        **plain,
        "prompt": list(prompt_ids),
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "repetition_penalty": 1.0,
        **({"ignore_eos": True} if cfg.ignore_eos else {}),
    }
    return ids, {**plain, "prompt": prompt}


async def post_json(session, url: str, body: dict, cfg: AgreeConfig) -> tuple[int, object]:
    """``(status, parsed JSON or error text)`` of one POST. Redirects are not followed.

    Raises:
        UserError: no connection, a timeout, or a 2xx answer that is not JSON (the URL redacted, secrets masked).
    """
    import aiohttp

    shown, secrets = redact_url(url), secrets_of(cfg.url, cfg.api_key_env)
    headers = {"Content-Type": "application/json", **auth_headers(cfg.api_key_env, url)}
    try:
        async with session.post(url, json=body, headers=headers, allow_redirects=False) as r:
            text = (await r.read()).decode("utf-8", "replace")
            if r.status != 200:
                return r.status, short_error(scrub(text, secrets), 300)
            return 200, json.loads(text)
    except TimeoutError:
        raise UserError(f"POST {shown}: no answer within {cfg.timeout_s:g} s (--timeout-s)") from None
    except (aiohttp.ClientError, OSError, ValueError) as e:
        why = scrub(describe_exception(e), secrets)
        raise UserError(f"POST {shown} failed ({why}): is an OpenAI-compatible server running there?") from None


async def query_server(model: str, prompts: list[tuple[list[int], str]], cfg: AgreeConfig) -> tuple[list, str]:
    """Each prompt's first choice (a dict) from ``/v1/completions``, and the request form used (``ids`` or
    ``text``, the same for every prompt: ``text`` once the server refused the ids form).

    Raises:
        UserError: an HTTP error other than a refusal of the ids form, or an answer without ``choices``.
    """
    import aiohttp

    url = endpoint_url(cfg.url, "/v1/completions")
    form, choices = "ids", []
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=cfg.timeout_s)) as s:
        for ids, text in prompts:
            ids_body, text_body = request_bodies(model, ids, text, cfg)
            status, data = await post_json(s, url, ids_body if form == "ids" else text_body, cfg)
            if status in REFUSED and form == "ids" and not choices:
                form = "text"  # e.g. transformers serve: a text prompt only, no vLLM fields
                status, data = await post_json(s, url, text_body, cfg)
            if status != 200:
                raise UserError(f"POST {redact_url(url)}: HTTP {status} ({form} prompt): {data}")
            got = data.get("choices") if isinstance(data, dict) else None
            if not isinstance(got, list) or not got or not isinstance(got[0], dict):
                raise UserError(f"POST {redact_url(url)}: not a completions answer (no choices): {str(data)[:200]}")
            choices.append(got[0])
    return choices, form


def server_tokens(choice: dict, tokenizer) -> tuple[list[int], list[float | None], str]:
    """``(ids, log-probs, source)`` of one choice: ``token_ids`` if present, else ids from ``token_id:N`` log-prob
    tokens, else the text re-tokenised (no special tokens). Log-probs are kept only when they align one to one
    with the ids (else ``[]``)."""
    lp = choice.get("logprobs") if isinstance(choice.get("logprobs"), dict) else {}
    values = lp.get("token_logprobs") if isinstance(lp.get("token_logprobs"), list) else []
    tokens = lp.get("tokens") if isinstance(lp.get("tokens"), list) else []
    ids = choice.get("token_ids")
    if isinstance(ids, list) and all(isinstance(i, int) for i in ids):
        source = "token_ids"
    elif tokens and all(isinstance(t, str) and t.startswith("token_id:") for t in tokens):
        ids, source = [int(t.split(":", 1)[1]) for t in tokens], "logprobs"
    else:
        ids = tokenizer(str(choice.get("text") or ""), add_special_tokens=False)["input_ids"]
        source = "retokenized"
    values = [float(v) if isinstance(v, int | float) else None for v in values]
    return list(ids), (values if len(values) == len(ids) else []), source


# ---------------------------------------------------------------- the reference
def eos_ids(model) -> set[int]:
    """The checkpoint's EOS token ids (its generation config's, else its config's), as a set."""
    eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    eos = eos if eos is not None else getattr(model.config, "eos_token_id", None)
    return set() if eos is None else {int(e) for e in (eos if isinstance(eos, list | tuple) else [eos])}


def reference_greedy(model, prompt_ids: list[int], n: int, stop_ids: set[int]) -> list[int]:
    """``n`` new token ids by argmax (stopping after a token of ``stop_ids``). Shapes: one sequence, ``[1, L]`` in.

    Each step recomputes the whole sequence (no KV cache: the same computation as :func:`reference_logprobs`, and
    no cache keyword that changes between transformers versions); the cost is ``n`` forward passes of at most
    ``len(prompt_ids) + n`` tokens.
    """
    import torch

    seq, new = list(prompt_ids), []
    with torch.inference_mode():
        while len(new) < n and not (new and new[-1] in stop_ids):
            ids = torch.tensor([seq], device=model.device)
            logits = model(input_ids=ids, use_cache=False, logits_to_keep=1).logits[0, -1]
            new.append(int(torch.argmax(logits.float())))
            seq.append(new[-1])
    return new


def reference_logprobs(model, prompt_ids: list[int], server_ids: list[int]):
    """The reference's ``log_softmax`` (float32, nats) at each of the server's positions, in the server's context:
    one forward pass over prompt + server ids. Shape ``[len(server_ids), vocab]`` (``None`` for no server ids)."""
    import torch

    if not server_ids:
        return None
    with torch.inference_mode():
        ids = torch.tensor([list(prompt_ids) + list(server_ids)], device=model.device)
        logits = model(input_ids=ids, use_cache=False).logits[0, len(prompt_ids) - 1 : -1].float()
        return torch.log_softmax(logits, dim=-1).cpu()


def compare_prompt(model, prompt: tuple[list[int], str], served: tuple, cfg: AgreeConfig, stop_ids: set[int]):
    """One :class:`PromptAgreement` from the prompt ``(ids, text)``, the server's ``(ids, log-probs, source)`` and
    the reference model."""
    (prompt_ids, text), (s_ids, s_lps, source) = prompt, served
    r_ids = reference_greedy(model, prompt_ids, int(cfg.max_tokens), stop_ids)
    table = reference_logprobs(model, prompt_ids, s_ids)
    vocab = 0 if table is None else table.shape[1]
    r_lps = [float(table[i, t]) if 0 <= t < vocab else None for i, t in enumerate(s_ids)]
    k = first_divergence(s_ids, r_ids)
    gap = None
    if k is not None and k < min(len(s_ids), len(r_ids)) and 0 <= s_ids[k] < vocab:
        gap = float(table[k].max() - table[k, s_ids[k]])
    agreement, diff = token_agreement(s_ids, r_ids), max_abs_diff(s_lps, r_lps)
    gated = cfg.max_logprob_diff is not None and diff is not None and diff > cfg.max_logprob_diff
    return PromptAgreement(
        text, list(prompt_ids), s_ids, r_ids, source, k, agreement, diff, gap,
        passed=agreement >= cfg.min_agreement and not gated, server_logprobs=s_lps,
    )  # fmt: skip


def reference_device(cfg: AgreeConfig) -> str:
    """The torch device the reference runs on (``cuda:N`` kept as given), after checking that it exists and runs
    ``cfg.dtype``.

    Raises:
        UserError: an unknown device name, a GPU this torch build does not see, or a dtype the device cannot run.
    """
    from kit import hardware
    from kit.dtypes import to_torch

    info = hardware.detect(cfg.device)
    device = str(cfg.device) if str(cfg.device).startswith("cuda:") else info.device
    hardware.check_dtype_supported(to_torch(cfg.dtype), device)
    return device


def is_prompt(p) -> bool:
    """A prompt :func:`agree` takes: a text with a non-space character, or a non-empty list of token ids (ints >= 0)."""
    if isinstance(p, str):
        return bool(p.strip())
    return (
        isinstance(p, list | tuple)
        and bool(p)
        and all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in p)
    )


def agree(prompts: list[str | list[int]] | None = None, config: AgreeConfig | None = None, **options) -> AgreeReport:
    """Send ``prompts`` greedily to the endpoint and through the in-process reference; compare (module docstring).

    Args:
        prompts: prompt texts (default :data:`DEFAULT_PROMPTS`), tokenised with the reference's tokenizer (its
            special tokens included, as a server tokenises a text prompt), or lists of token ids sent as they are
            (a text-only server gets their decoded text).
        config: an :class:`AgreeConfig`, or its fields as keywords (``url=...``, ``dtype="bfloat16"``).

    Returns: an :class:`AgreeReport` (``report.passed``; ``report.summary()``; ``report.to_json()``).

    Raises:
        UserError: a bad setting or prompt (empty list, an empty text), an unknown option, a server that cannot be
            reached or answers with an error, no local checkpoint at the reference path (one line each).
    """
    from kit.models import load_checkpoint
    from kit.serve.loop import run_coro

    cfg, rest = config_with(AgreeConfig, config, options)
    if rest:
        raise UserError(f"unknown option(s) {sorted(rest)}; allowed: the fields of AgreeConfig")
    cfg = check_agree_config(cfg)
    device = reference_device(cfg)
    texts = list(DEFAULT_PROMPTS if prompts is None else prompts)
    if not texts or not all(is_prompt(t) for t in texts):
        raise UserError(f"prompts={texts!r}: give one or more non-empty texts or lists of token ids (ints >= 0)")
    model_id = cfg.model or run_coro(get_model_id(cfg.url, cfg.api_key_env, min(cfg.timeout_s, 30.0)))
    ref_path = cfg.reference or model_id
    tokenizer = load_tokenizer(ref_path)
    pairs = [
        (list(tokenizer(t)["input_ids"]), t) if isinstance(t, str) else (list(t), tokenizer.decode(t)) for t in texts
    ]
    choices, form = run_coro(query_server(model_id, pairs, cfg))  # the server first: its errors before a load
    model = load_checkpoint(ref_path, cfg.dtype, device)
    stop_ids = set() if form == "ids" and cfg.ignore_eos else eos_ids(model)
    rows = [compare_prompt(model, p, server_tokens(c, tokenizer), cfg, stop_ids) for p, c in zip(pairs, choices)]
    settings = {
        **{k: v for k, v in asdict(cfg).items() if k != "url"},
        "url": redact_url(cfg.url),
        "model": model_id,
        "reference": str(ref_path),
        "request_form": form,
    }
    return AgreeReport(rows, settings)
