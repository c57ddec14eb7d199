"""The model roles (policy, reference, critic, reward) and the tokenizer, built from a TrainConfig."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..config.sizing import builtin_max_new_tokens
from ..config.specs import is_model_path, reward_specs
from ..config.train import ModelConfig, TrainConfig
from ..models.actor_critic import REWARD_MEAN_KEY, REWARD_STD_KEY, CriticModel, PolicyModel
from ..models.hf_compat import disable_dropout, load_tokenizer, scalar_head, trunk
from ..models.loading import check_tokenizer_dir, load_model
from ..records import console
from ..rollout.score.reward import RewardTerm, load_verifier, term_name
from ..runtime.errors import ConfigError
from ..tasks import reasoning_gym

if TYPE_CHECKING:  # imported where used: the environment's pool only with `rollout.env`
    pass

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(spec: str) -> torch.device:
    if spec == "auto":
        if torch.cuda.is_available():
            import os

            return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        return torch.device("cpu")
    try:
        device = torch.device(spec)
    except RuntimeError:
        raise ConfigError(f"`model.device`: {spec!r} is not a device; use auto, cpu, cuda or cuda:N") from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"`model.device`: {spec!r} asked for, but this torch build sees no CUDA device; "
                          "use cpu or auto")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise ConfigError(f"`model.device`: {spec!r}, but only {torch.cuda.device_count()} CUDA device(s) exist")
    return device


def build_tokenizer(cfg: ModelConfig):
    """The tokenizer, with a pad token that is neither EOS nor any other stop token:
    ``model.pad_token`` when set, else its own, else a free special token (logged). ppo-lm masks padding
    by length, never by id; :func:`ensure_pad_token` says why the pad token must still be no stop token."""
    source = cfg.tokenizer or cfg.policy
    if source == "builtin":
        from ..tasks.equations import build_tokenizer as builtin

        tok = builtin()
    else:
        check_tokenizer_dir(source, "model.tokenizer" if cfg.tokenizer else "model.policy")
        try:
            tok = load_tokenizer(source)
        except (OSError, ValueError, TypeError) as e:
            first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise ConfigError(f"the tokenizer in {source!r} could not be loaded: {first}") from None
    if cfg.pad_token is not None:
        if cfg.pad_token not in tok.get_vocab():
            raise ConfigError(f"`model.pad_token`={cfg.pad_token!r} is not in the tokenizer's vocabulary")
        tok.pad_token = cfg.pad_token
    ensure_pad_token(tok, policy_stop_ids(cfg.policy))
    return tok


def policy_stop_ids(policy: str) -> list[int]:
    """The end-of-turn ids a checkpoint's generation config declares (``eos_token_id``: an id or a
    list, e.g. ``<|im_end|>`` and ``<|endoftext|>``), read from its JSON files before it loads."""
    import json

    if policy == "builtin":
        return []
    for name in ("generation_config.json", "config.json"):
        f = Path(policy) / name
        try:
            eos = json.loads(f.read_text()).get("eos_token_id") if f.is_file() else None
        except (OSError, ValueError):
            eos = None
        if eos is not None:
            return [eos] if isinstance(eos, int) else [int(i) for i in eos]
    return []


def generation_stop_ids(lm: nn.Module) -> list[int]:
    """The end-of-turn ids of a loaded model's generation config (an id or a list)."""
    eos = getattr(getattr(lm, "generation_config", None), "eos_token_id", None)
    if eos is None:
        return []
    return [int(eos)] if isinstance(eos, int) else [int(i) for i in eos]


def single_token_id(tok, text: str, field: str) -> int:
    """The id of ``text`` as one token: a vocabulary entry (``<|im_end|>``), or text that encodes to
    exactly one token (``"\\n"``, which byte-level vocabularies store as ``Ċ``)."""
    tid = tok.convert_tokens_to_ids(text)
    if tid is None or tid == tok.unk_token_id:
        ids = tok.encode(text, add_special_tokens=False)
        tid = ids[0] if len(ids) == 1 else None
    if tid is None:
        raise ConfigError(f"`{field}`: {text!r} is not a single token of the tokenizer")
    return int(tid)


def ensure_pad_token(tok, stop_ids: list[int] = ()) -> None:
    """Give ``tok`` a pad token that no stop token shares. Most instruct models set pad = EOS; then
    a special token that is not a stop token, not BOS, and not written by the chat template is taken
    (logged), preferring one named like a pad token. Raises :class:`ConfigError` naming
    ``model.pad_token`` when there is none.

    Inside ppo-lm every mask is by length (attention masks, response masks, the reward model's last
    token), never by id: the sampler does not mask the pad token's logit, and a pad token it draws is
    an ordinary response token, kept, scored and counted. The pad token must still be none of the stop
    tokens (nor BOS, nor a token the chat template writes) for the users of the tokenizer saved with
    every checkpoint: tools that find padding by id — transformers' language-modelling collator masks
    the labels at pad ids, its sequence-classification models score the last token that is not pad —
    would take the stop token that ends each response for padding (a fine-tuned model would never
    learn to stop; a reward model would score the token before it)."""
    if tok.eos_token_id is None:
        raise ConfigError("the tokenizer has no EOS token: responses could never terminate")
    stops = {tok.eos_token_id, *stop_ids}
    if tok.pad_token_id is not None and tok.pad_token_id not in stops:
        return
    template = tok.chat_template if isinstance(getattr(tok, "chat_template", None), str) else ""
    specials = list(dict.fromkeys([*tok.all_special_tokens,
                                   *(a.content for a in tok.added_tokens_decoder.values() if a.special)]))
    free = [s for s in specials if tok.convert_tokens_to_ids(s) not in stops | {tok.bos_token_id}
            and s not in template]
    if not free:
        why = "has no pad token" if tok.pad_token_id is None else f"pads with a stop token ({tok.pad_token!r})"
        raise ConfigError(
            f"the tokenizer {why} and has no free special token to pad with: set `model.pad_token` to a token "
            "of its vocabulary that is not a stop token (the checkpoints save the tokenizer with it, and tools "
            "that find padding by id would take the stop token that ends each response for padding)")
    choice = sorted(free, key=lambda s: ("pad" not in s.lower(), s != tok.unk_token))[0]
    was = "no pad token" if tok.pad_token_id is None else f"pad token {tok.pad_token!r}, a stop token"
    console.say(f"tokenizer: {was}; padding with the free special token {choice!r} (id "
                f"{tok.convert_tokens_to_ids(choice)}); set `model.pad_token` to choose another")
    tok.pad_token = choice


def build_policy(cfg: TrainConfig, tokenizer) -> nn.Module:
    m = cfg.model
    if m.policy == "builtin":
        from ..tasks.equations import build_tiny_policy

        max_pos = max(128, 64 + builtin_max_new_tokens(cfg))
        lm = build_tiny_policy(
            tokenizer, seed=cfg.seed, hidden_size=m.builtin_hidden_size, num_layers=m.builtin_layers,
            num_heads=m.builtin_heads, max_position_embeddings=max_pos,
        )
    else:
        from transformers import AutoModelForCausalLM

        with console.loading("the policy", m.policy):
            lm = load_model(AutoModelForCausalLM, m.policy, "model.policy", "causal-lm", dtype=DTYPES[m.dtype])
    return lm.to(DTYPES[m.dtype])


def frozen_copy(model: nn.Module) -> nn.Module:
    ref = copy.deepcopy(model)
    ref.requires_grad_(False)
    disable_dropout(ref)
    return ref


def load_reward_model(path: str, dtype: str) -> nn.Module:
    """A frozen one-label sequence-classification reward model (e.g. ``ppo-lm rm`` output)."""
    from transformers import AutoModelForSequenceClassification

    with console.loading("the reward model", path):
        rm = load_model(AutoModelForSequenceClassification, path, "model.reward", "sequence-classification",
                        dtype=DTYPES[dtype])
    if rm.config.num_labels != 1:
        raise ConfigError(f"`model.reward`: the reward model must have one label, it has {rm.config.num_labels}")
    rm.requires_grad_(False)
    disable_dropout(rm)
    return rm


def load_reward_verifier(spec: str, cfg: TrainConfig, field: str = "model.reward"):
    """The verifier a reward spec names (ConfigError naming ``field`` when it cannot be loaded): a
    reasoning-gym task's scorer reads the run's task settings (``data.task_*``)."""
    if spec == reasoning_gym.REWARD:
        task = reasoning_gym.task_of(cfg.data.prompts)
        try:
            return reasoning_gym.reward(cfg.data.task_answer, task, cfg.data.task_config if task is not None else None)
        except reasoning_gym.TaskError as e:
            raise ConfigError(str(e)) from None
    try:
        return load_verifier(spec, field)
    except ValueError as e:
        hint = "" if ":" in spec or field != "model.reward" else ", or a reward-model checkpoint directory (none found there)"
        raise ConfigError(f"{e}{hint}") from None


def given_reward_terms(verifier, cfg: ModelConfig) -> list[RewardTerm]:
    """Terms for verifiers passed from Python: one callable, or a list of them (weighted by
    ``model.reward_weights``), named after their functions."""
    fns = list(verifier) if isinstance(verifier, (list, tuple)) else [verifier]
    weights = list(cfg.reward_weights) or [1.0] * len(fns)
    if len(weights) != len(fns):
        raise ConfigError(f"`model.reward_weights` has {len(weights)} weights for {len(fns)} verifiers")
    names = _unique([getattr(f, "__name__", "") or "reward" for f in fns])
    return [RewardTerm(n, w, verifier=f) for n, f, w in zip(names, fns, weights)]


def _unique(names: list[str]) -> list[str]:
    """Metric names: a name used more than once gets its position appended (``length_2``)."""
    return [n if names.count(n) == 1 else f"{n}_{i + 1}" for i, n in enumerate(names)]


def reward_terms(cfg: TrainConfig, verifiers: dict[str, object], dtype: str) -> list[RewardTerm]:
    """Every reward of ``model.reward`` as a :class:`RewardTerm`: verifiers from ``verifiers`` (loaded
    by the start-up checks), reward models loaded here."""
    specs = reward_specs(cfg)
    terms = []
    for name, (spec, weight) in zip(_unique([term_name(s) for s, _ in specs]), specs):
        if is_model_path(spec):
            terms.append(RewardTerm(name, weight, model=load_reward_model(spec, dtype)))
        else:
            terms.append(RewardTerm(name, weight, verifier=verifiers[spec]))
    return terms


def build_gold_verifier(cfg: TrainConfig):
    if cfg.model.gold_reward is None:
        return None
    if is_model_path(cfg.model.gold_reward):  # verifiers only: a gold standard
        raise ConfigError(f"`model.gold_reward`={cfg.model.gold_reward!r}: a verifier ('module:function', "
                          "'path/to/file.py:function', 'builtin:equations' or 'reasoning-gym'), not a reward model")
    return load_reward_verifier(cfg.model.gold_reward, cfg, field="model.gold_reward")


def critic_class(config):
    """The Auto class of a separate critic for ``config``: token classification (one value per
    position), or sequence classification where transformers has no token-classification head for
    the architecture (e.g. Gemma 3 text); the critic reads its head at every position either way."""
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification
    from transformers.models.auto.modeling_auto import MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES

    if config.model_type in MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES:
        return AutoModelForTokenClassification
    return AutoModelForSequenceClassification


def build_critic(cfg: TrainConfig, policy_lm: nn.Module, reward_model: nn.Module | None) -> CriticModel:
    """Separate-body critic: a one-label token-classification model whose body comes from the reward
    model (InstructGPT), the policy, or a checkpoint; the head is the reward head or fresh."""
    from transformers import AutoModelForTokenClassification

    source = cfg.critic.init
    if source == "auto":
        source = "reward" if reward_model is not None else "policy"
    if source == "reward" and reward_model is None:
        raise ConfigError("`critic.init`='reward' needs a reward model (`model.reward` is a verifier)")
    if source not in ("policy", "reward"):
        # any checkpoint's body will do; a head it lacks (e.g. a causal LM's) starts at zero below
        with console.loading("the critic's body", source):
            model = load_model(AutoModelForTokenClassification, source, "critic.init", "any",
                               require_head=False, num_labels=1, dtype=DTYPES[cfg.model.dtype])
    else:
        donor = reward_model if source == "reward" else policy_lm
        config = copy.deepcopy(donor.config)
        config.num_labels = 1
        config.classifier_dropout = 0.0
        with torch.random.fork_rng(devices=[]):
            model = critic_class(config).from_config(config, dtype=DTYPES[cfg.model.dtype])
        trunk(model).load_state_dict(trunk(donor).state_dict())
        head = scalar_head(model)
        with torch.no_grad():
            if head.bias is not None:
                head.bias.zero_()
            if source == "reward":
                # V starts as the reward model's score on the same scale PPO's rewards use: the rollout
                # normalises scores to (raw − mean)/std with the statistics saved with the model.
                rm_head = scalar_head(reward_model)
                mean = getattr(reward_model.config, REWARD_MEAN_KEY, None)
                std = getattr(reward_model.config, REWARD_STD_KEY, None)
                mean, std = (0.0, 1.0) if mean is None or std is None else (float(mean), float(std))
                head.weight.copy_(rm_head.weight / std)
                bias = float(rm_head.bias) if rm_head.bias is not None else 0.0
                if head.bias is not None:
                    head.bias.fill_((bias - mean) / std)
            else:
                head.weight.zero_()  # V ≡ 0 at the start: no arbitrary initial value estimates
    model.requires_grad_(True)
    disable_dropout(model)
    return CriticModel(model)


def build_shared_value_head(policy_lm: nn.Module) -> nn.Linear:
    head = nn.Linear(policy_lm.config.hidden_size, 1, dtype=next(policy_lm.parameters()).dtype)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    return head


def build_policy_module(cfg: TrainConfig, policy_lm: nn.Module, *, with_value_head: bool) -> PolicyModel:
    disable_dropout(policy_lm)
    head = build_shared_value_head(policy_lm) if with_value_head else None
    return PolicyModel(policy_lm, value_head=head, value_grad_scale=cfg.critic.value_grad_scale)
