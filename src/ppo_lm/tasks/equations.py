"""The built-in linear-equation task (docs/algorithm.md §5): data, verifier, tokenizer and tiny models.

Format (one character per token, see :func:`build_tokenizer`)::

    prompt   = "Solve 2x+3=11\\n"        # PROMPT_TEMPLATE.format(equation=...)
    response = "x=4"                    # the policy then emits EOS
    answer   = "4"                      # str(int), e.g. "-3"

Equations are ``a·x + b = c`` with ``a ∈ [1, max_coef]``, solution ``x ∈ [-max_solution,
max_solution]`` (``[0, max_solution]`` without ``allow_negative``), ``b ∈ [-max_bias, max_bias]``
(``[0, max_bias]`` without ``allow_negative``) and ``c = a·x + b``. They are written the way a person
would: ``x+3=5`` (a=1), ``2x=8`` (b=0), ``3x-4=-10`` (negative b and c).

Train/held-out split: each equation belongs to exactly one split, decided by a stable hash of its text
(not Python's salted ``hash``), so held-out prompts never appear in training whatever the seeds.
"""

from __future__ import annotations

import hashlib
import random
import re
import string
from collections.abc import Sequence
from dataclasses import dataclass

PROMPT_TEMPLATE = "Solve {equation}\n"
RESPONSE_TEMPLATE = "x={answer}"

PAD_TOKEN = "<pad>"
EOS_TOKEN = "<eos>"
BOS_TOKEN = "<bos>"
UNK_TOKEN = "<unk>"
SPECIAL_TOKENS = (PAD_TOKEN, EOS_TOKEN, BOS_TOKEN, UNK_TOKEN)
# More than the task needs, so the same tokenizer can encode hand-written prompts and variants.
CHARACTERS = string.digits + string.ascii_letters + " +-*/=().,:;?!'\"\n"

SPLITS = ("train", "heldout")

# The right-hand side must end there: "=11+1", "=11.5", "=11x" or "=11=9" are not "= 11" (a prompt may
# go on with words, "=11 for x.", or on the next line, "=11\n- answer as x=N").
_EQUATION_RE = re.compile(r"Solve\s*(-?\d*)x\s*(?:([+-])\s*(\d+))?\s*=\s*(-?\d+)(?!\.\d|\w|[ \t]*[=+\-*/^(])")


@dataclass(frozen=True)
class EquationTaskConfig:
    """Difficulty and split of the equation task. Larger ranges make the task harder."""

    max_coef: int = 5
    max_solution: int = 9
    max_bias: int = 9
    allow_negative: bool = True
    heldout_fraction: float = 0.2

    def __post_init__(self) -> None:
        if self.max_coef < 1:
            raise ValueError(f"max_coef must be >= 1, got {self.max_coef}")
        if self.max_solution < 0 or self.max_bias < 0:
            raise ValueError("max_solution and max_bias must be >= 0")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError(f"heldout_fraction must be in (0, 1), got {self.heldout_fraction}")


# ----------------------------------------------------------------------------------------------
# Equations and prompts
# ----------------------------------------------------------------------------------------------


def format_equation(a: int, b: int, c: int) -> str:
    """``(2, 3, 11) -> "2x+3=11"``; ``(1, 0, 5) -> "x=5"``; ``(3, -4, -10) -> "3x-4=-10"``."""
    coef = "" if a == 1 else str(a)
    bias = "" if b == 0 else f"{b:+d}"
    return f"{coef}x{bias}={c}"


def parse_equation(prompt: str) -> tuple[int, int, int]:
    """Find ``a·x ± b = c`` after the word ``Solve`` in ``prompt``; returns ``(a, b, c)``.

    Raises ``ValueError`` when no equation is found, so a misconfigured dataset fails loudly rather
    than scoring every response 0.
    """
    m = _EQUATION_RE.search(prompt)
    if m is None:
        raise ValueError(f"no linear equation 'Solve ax+b=c' found in prompt {prompt!r}")
    coef, sign, bias, rhs = m.groups()
    a = -1 if coef == "-" else (1 if coef == "" else int(coef))
    b = 0 if bias is None else int(bias) * (-1 if sign == "-" else 1)
    return a, b, int(rhs)


def solve_equation(prompt: str) -> str | None:
    """Integer solution of the prompt's equation as a string, or None when it has none."""
    a, b, c = parse_equation(prompt)
    if a == 0 or (c - b) % a != 0:
        return None
    return str((c - b) // a)


def split_of(equation: str, heldout_fraction: float) -> str:
    """``"train"`` or ``"heldout"``: a stable hash, so the split is the same in every process."""
    digest = hashlib.sha256(equation.encode("utf-8")).digest()
    u = int.from_bytes(digest[:8], "big") / 2.0**64
    return "heldout" if u < heldout_fraction else "train"


def _sample_equations(n: int, seed: int, cfg: EquationTaskConfig, split: str, unique: bool):
    """Yield ``n`` tuples ``(a, x, b, c)`` of ``split`` by rejection sampling.

    Rejection sampling (rather than enumerating all equations) keeps memory constant for any
    difficulty; a limit on consecutive rejections turns an impossible request (an exhausted unique
    pool, an empty split) into an error instead of a hang.
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"ppo_lm.equations/{seed}/{split}")
    lo_x = -cfg.max_solution if cfg.allow_negative else 0
    lo_b = -cfg.max_bias if cfg.allow_negative else 0
    seen: set[tuple[int, int, int]] = set()
    out: list[tuple[int, int, int, int]] = []
    misses = 0
    while len(out) < n:
        misses += 1
        if misses > 20_000:
            raise ValueError(
                f"could only draw {len(out)} of {n} {'unique ' if unique else ''}{split} equations "
                f"from {cfg}; widen the ranges or ask for fewer"
            )
        a = rng.randint(1, cfg.max_coef)
        x = rng.randint(lo_x, cfg.max_solution)
        b = rng.randint(lo_b, cfg.max_bias)
        c = a * x + b
        if unique and (a, b, c) in seen:
            continue
        if split_of(format_equation(a, b, c), cfg.heldout_fraction) != split:
            continue
        seen.add((a, b, c))
        out.append((a, x, b, c))
        misses = 0
    return out


def make_prompts(
    n: int,
    seed: int = 0,
    cfg: EquationTaskConfig | None = None,
    split: str = "train",
    unique: bool = False,
) -> list[dict]:
    """``n`` rows ``{"prompt": "Solve 2x+3=11\\n", "answer": "4"}`` from ``split``, deterministic in ``seed``.

    ``unique=True`` draws without repetition (for evaluation sets).
    """
    cfg = cfg or EquationTaskConfig()
    return [
        {"prompt": PROMPT_TEMPLATE.format(equation=format_equation(a, b, c)), "answer": str(x)}
        for a, x, b, c in _sample_equations(n, seed, cfg, split, unique)
    ]


def _wrong_answer(a: int, x: int, b: int, c: int, rng: random.Random) -> int:
    """A plausible mistake: off by one, a sign error, or forgetting to divide by the coefficient."""
    kinds = ["off_by_one", "sign"]
    if a > 1 and c - b != x:
        kinds.append("no_divide")
    kind = rng.choice(kinds)
    if kind == "sign" and x != 0:
        return -x
    if kind == "no_divide":
        return c - b
    return x + rng.choice((-1, 1))


def sft_demonstrations(
    n: int,
    seed: int = 0,
    cfg: EquationTaskConfig | None = None,
    error_rate: float = 0.3,
    split: str = "train",
) -> list[dict]:
    """``n`` rows ``{"prompt", "response", "answer", "correct"}``; about ``error_rate`` of them wrong.

    The wrong ones keep the ``x=<int>`` format, so SFT learns the format perfectly but the answers only
    imperfectly, which leaves PPO something to improve. Each row is wrong independently with
    probability ``error_rate`` (deterministic in ``seed``).
    """
    if not 0.0 <= error_rate <= 1.0:
        raise ValueError(f"error_rate must be in [0, 1], got {error_rate}")
    cfg = cfg or EquationTaskConfig()
    rng = random.Random(f"ppo_lm.sft/{seed}")
    rows = []
    for a, x, b, c in _sample_equations(n, seed, cfg, split, unique=False):
        wrong = rng.random() < error_rate
        shown = _wrong_answer(a, x, b, c, rng) if wrong else x
        rows.append(
            {
                "prompt": PROMPT_TEMPLATE.format(equation=format_equation(a, b, c)),
                "response": RESPONSE_TEMPLATE.format(answer=shown),
                "answer": str(x),
                "correct": not wrong,
            }
        )
    return rows


def preference_pairs(
    n: int,
    seed: int = 0,
    cfg: EquationTaskConfig | None = None,
    split: str = "train",
) -> list[dict]:
    """``n`` rows ``{"prompt", "chosen", "rejected", "answer"}``: the correct answer over a plausible wrong one."""
    cfg = cfg or EquationTaskConfig()
    rng = random.Random(f"ppo_lm.pairs/{seed}")
    rows = []
    for a, x, b, c in _sample_equations(n, seed, cfg, split, unique=False):
        rows.append(
            {
                "prompt": PROMPT_TEMPLATE.format(equation=format_equation(a, b, c)),
                "chosen": RESPONSE_TEMPLATE.format(answer=x),
                "rejected": RESPONSE_TEMPLATE.format(answer=_wrong_answer(a, x, b, c, rng)),
                "answer": str(x),
            }
        )
    return rows


# ----------------------------------------------------------------------------------------------
# Verifier
# ----------------------------------------------------------------------------------------------


def verify(
    prompts: Sequence[str],
    responses: Sequence[str],
    answer: Sequence[str | int | None] | None = None,
    **columns,
) -> list[float]:
    """Rule-based reward: ``1.0`` if the response is exactly ``x=<answer>``, else ``0.0``; shape (B,).

    ``responses`` are decoded with EOS already removed; surrounding whitespace is ignored, anything
    else (``x = 4``, ``x=04``, ``4``, trailing text) scores 0. ``answer`` is the dataset column when
    present; when it is None (or an entry is None) the equation is parsed from the prompt and solved.
    Extra dataset columns arrive as ``**columns`` and are ignored: this is the verifier signature
    ``(prompts, responses, **extra_columns) -> scores`` the trainer calls. A penalty for responses
    that never emitted EOS belongs to the trainer, which knows about truncation.
    """
    if len(prompts) != len(responses):
        raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
    if answer is not None and len(answer) != len(prompts):
        raise ValueError(f"{len(prompts)} prompts but {len(answer)} answers")
    scores = []
    for i, (prompt, response) in enumerate(zip(prompts, responses)):
        target = answer[i] if answer is not None else None
        if target is None:
            target = solve_equation(prompt)
        if target is None:  # no integer solution: nothing the format can express is correct
            scores.append(0.0)
            continue
        expected = RESPONSE_TEMPLATE.format(answer=int(target))
        scores.append(1.0 if response.strip() == expected else 0.0)
    return scores


# ----------------------------------------------------------------------------------------------
# Tokenizer and tiny models
# ----------------------------------------------------------------------------------------------


def _byte_level(text: str) -> str:
    """``text`` in the byte-level alphabet of GPT-2-style tokenizers: each UTF-8 byte one printable
    character (space → "Ġ", newline → "Ċ"; printable ASCII stays itself): GPT-2's table, printable
    bytes map to themselves and the others, in order, to U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    table = {**{b: chr(b) for b in printable}, **{b: chr(256 + i) for i, b in enumerate(others)}}
    return "".join(table[b] for b in text.encode("utf-8"))


def build_tokenizer(model_max_length: int = 512):
    """Character-level ``PreTrainedTokenizerFast`` built offline; one token per character.

    Ids: ``<pad>``=0, ``<eos>``=1, ``<bos>``=2, ``<unk>``=3, then :data:`CHARACTERS` (a character
    outside them is ``<unk>``). No special tokens are added on encode (prompts are plain text;
    responses end with EOS by generation). ``decode(encode(s)) == s`` for any ``s`` over
    :data:`CHARACTERS`. ``padding_side="left"`` because generation continues from the right end of
    the prompt.

    The pipeline is the one transformers' ``Qwen2Tokenizer`` rebuilds around a saved vocabulary —
    NFC, one pre-token per character, byte-level symbols (a space is the token "Ġ", a newline "Ċ"),
    byte-level decoding — because ``AutoTokenizer.from_pretrained`` of a saved built-in checkpoint
    (a Qwen2 ``config.json``) picks that class whatever ``tokenizer_config.json`` declares, and keeps
    only the vocabulary: plain characters as tokens would lose every space and newline there. So a
    checkpoint loads with the same ids through ``AutoTokenizer`` (except that a character outside
    :data:`CHARACTERS` is dropped there, not ``<unk>``).
    """
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(list(SPECIAL_TOKENS) + [_byte_level(c) for c in CHARACTERS])}
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK_TOKEN))
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated"),  # [\s\S] rather than ".": newlines too
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        eos_token=EOS_TOKEN,
        bos_token=BOS_TOKEN,
        unk_token=UNK_TOKEN,
        padding_side="left",
        clean_up_tokenization_spaces=False,
        model_max_length=model_max_length,
    )


BUILTIN_HEADS = 4
"""Attention heads of the built-in model (as many key/value heads): its hidden size must be a multiple
of twice this, as RoPE splits each head's width in halves."""


def tiny_model_config(
    tokenizer,
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = BUILTIN_HEADS,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 128,
    tie_word_embeddings: bool = False,
    num_kv_heads: int | None = None,
):
    """A small ``Qwen2Config`` sized to ``tokenizer`` (vocab and pad/eos/bos ids taken from it)."""
    from transformers import Qwen2Config

    if hidden_size % num_heads != 0:
        raise ValueError(f"hidden_size {hidden_size} is not divisible by num_heads {num_heads}")
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=intermediate_size or 4 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads or num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=tokenizer.bos_token_id,
    )


def build_tiny_policy(tokenizer, seed: int = 0, attn_implementation: str = "sdpa", **config_kwargs):
    """Randomly initialised fp32 ``Qwen2ForCausalLM`` for ``tokenizer``; weights depend only on ``seed``.

    ``config_kwargs`` go to :func:`tiny_model_config`. The model is returned in whatever mode
    ``from_config`` leaves it; callers set ``train()``/``eval()`` themselves.
    """
    import torch
    from transformers import AutoModelForCausalLM

    config = tiny_model_config(tokenizer, **config_kwargs)
    # fork_rng: seeding must not disturb the caller's global RNG stream.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(
            config, attn_implementation=attn_implementation, dtype=torch.float32
        )
    return model
