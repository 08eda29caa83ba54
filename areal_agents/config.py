"""Experiment configuration: dataclasses with one help line per field.

Every section validates its final values in ``__post_init__`` by raising
:class:`ConfigError` with the field name; :mod:`areal_agents.config_loader` adds the
section path so the user sees one line such as ``actor.lr: must be > 0 (got -1.0)``.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "ConfigError",
    "DataConfig",
    "DTYPES",
    "EnvConfig",
    "EvalConfig",
    "ExperimentConfig",
    "InferenceConfig",
    "LoggingConfig",
    "RolloutConfig",
    "SFTConfig",
    "SGLangConfig",
    "SGLANG_MIN_VERSION",
    "SamplingConfig",
    "TrainerConfig",
    "shown_key",
]

DTYPES = ("float32", "bfloat16", "float16")
SGLANG_MIN_VERSION = "0.4.9.post2"


class ConfigError(ValueError):
    """A config value breaks a rule; ``key`` is the (possibly partial) dotted key."""

    def __init__(self, key: str, rule: str) -> None:
        super().__init__(f"{shown_key(key)}: {rule}")
        self.key = key
        self.rule = rule


def shown_key(key: str) -> str:
    """``key`` as a one-line message names it: quoted (``repr``) when it is empty, holds control
    characters, ``": "`` or surrounding spaces, or starts with a quote, so ``KEY: rule`` still
    reads unambiguously; ordinary dotted keys stay bare."""
    plain = bool(key) and key.isprintable() and key == key.strip() and ": " not in key and key[0] not in "'\""
    return key if plain else repr(key)


def f(default: Any, help: str) -> Any:  # noqa: A002 - "help" mirrors argparse
    """A dataclass field with a default (copied when mutable) and a one-line help."""
    if isinstance(default, (list, dict)):
        factory: Callable[[], Any] = lambda: copy.deepcopy(default)  # noqa: E731
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


def _check(ok: bool, key: str, rule: str) -> None:
    if not ok:
        raise ConfigError(key, rule)


def _choice(value: Any, key: str, choices: tuple[Any, ...]) -> None:
    _check(value in choices, key, f"must be one of {', '.join(map(str, choices))} (got {value!r})")


@dataclass
class EnvConfig:
    """Which environment to play and how its rewards are discounted."""

    name: str = f("math", "Registered env name (see `areal-agents list envs`).")
    kwargs: dict[str, Any] = f({}, "Extra keyword arguments passed to the env constructor.")
    turn_discount: float = f(1.0, "Per-turn reward discount gamma in (0, 1]; return = sum gamma^k r_k.")

    def __post_init__(self) -> None:
        _check(0.0 < self.turn_discount <= 1.0, "turn_discount", f"must be in (0, 1] (got {self.turn_discount})")


@dataclass
class AgentConfig:
    """The agent loop that plays the env."""

    name: str = f("chat", "Registered agent name (see `areal-agents list agents`).")
    max_turns: int = f(4, "Maximum LLM turns per episode.")
    max_tokens: int = f(1024, "Maximum generated tokens per episode over all turns.")
    system_prompt: str | None = f(None, "Optional system message prepended to every episode.")
    kwargs: dict[str, Any] = f({}, "Extra keyword arguments passed to the agent constructor.")

    def __post_init__(self) -> None:
        _check(self.max_turns >= 1, "max_turns", f"must be >= 1 (got {self.max_turns})")
        _check(self.max_tokens >= 1, "max_tokens", f"must be >= 1 (got {self.max_tokens})")


@dataclass
class DataConfig:
    """Where training and evaluation prompts come from."""

    name: str | None = f(None, "Registered dataset name; None uses the env's default dataset.")
    path: str | None = f(None, "Local JSONL/Parquet file, for datasets that read one.")
    train_size: int = f(2000, "Number of training rows (synthetic datasets).")
    test_size: int = f(500, "Number of evaluation rows (synthetic datasets).")
    shuffle: bool = f(True, "Shuffle training rows each epoch (seeded).")
    kwargs: dict[str, Any] = f({}, "Extra keyword arguments passed to the dataset factory.")

    def __post_init__(self) -> None:
        _check(self.train_size >= 1, "train_size", f"must be >= 1 (got {self.train_size})")
        _check(self.test_size >= 0, "test_size", f"must be >= 0 (got {self.test_size})")


@dataclass
class SamplingConfig:
    """Sampling parameters sent to the inference server for training rollouts."""

    max_new_tokens: int = f(32, "Maximum new tokens per LLM turn.")
    temperature: float = f(1.0, "Sampling temperature; logprobs are log_softmax(logits / temperature).")
    top_p: float = f(1.0, "Nucleus sampling threshold in (0, 1].")
    top_k: int = f(-1, "Top-k sampling; -1 disables.")
    stop: list[str] = f([], "Stop strings that end a turn.")

    def __post_init__(self) -> None:
        _check(self.max_new_tokens >= 1, "max_new_tokens", f"must be >= 1 (got {self.max_new_tokens})")
        _check(self.temperature >= 0.0, "temperature", f"must be >= 0 (got {self.temperature})")
        _check(0.0 < self.top_p <= 1.0, "top_p", f"must be in (0, 1] (got {self.top_p})")
        _check(self.top_k == -1 or self.top_k >= 1, "top_k", f"must be -1 or >= 1 (got {self.top_k})")


@dataclass
class SGLangConfig:
    """Launch options for SGLang servers (inference.backend=sglang)."""

    dtype: str = f("${actor.dtype}", "Server weight dtype; defaults to actor.dtype.")
    tp_size: int = f(1, "Tensor-parallel size per server.")
    mem_fraction_static: float = f(0.8, "Fraction of GPU memory SGLang reserves for weights and KV cache.")
    random_seed: int = f(1, "Server sampling seed.")
    extra_args: list[str] = f([], "Extra command-line arguments for sglang.launch_server.")

    def __post_init__(self) -> None:
        if not self.dtype.startswith("${"):  # unresolved only when built directly in Python
            _choice(self.dtype, "dtype", DTYPES)
        _check(self.tp_size >= 1, "tp_size", f"must be >= 1 (got {self.tp_size})")
        _check(
            0.0 < self.mem_fraction_static < 1.0,
            "mem_fraction_static",
            f"must be in (0, 1) (got {self.mem_fraction_static})",
        )


def _check_sglang_version(key: str) -> None:
    from importlib.metadata import PackageNotFoundError, version

    from packaging.version import Version

    try:
        found = version("sglang")
    except PackageNotFoundError:
        raise ConfigError(
            key, f"backend 'sglang' needs sglang >= {SGLANG_MIN_VERSION}: pip install 'areal-agents[sglang]'"
        ) from None
    _check(
        Version(found) >= Version(SGLANG_MIN_VERSION),
        key,
        f"backend 'sglang' needs sglang >= {SGLANG_MIN_VERSION} for weight updates (found {found})",
    )


@dataclass
class InferenceConfig:
    """Inference servers: embedded (CPU default), SGLang, or already-running ones."""

    backend: str = f("embedded", "embedded | sglang | remote (attach to inference.addresses).")
    addresses: list[str] = f([], "host:port of running servers (backend=remote).")
    num_servers: int = f(1, "Servers to launch (data parallel).")
    host: str = f("127.0.0.1", "Interface launched servers bind to.")
    schedule: str = f("round_robin", "Server choice per episode: round_robin | least_loaded.")
    request_timeout: float = f(300.0, "Seconds before one /generate request is retried.")
    request_retries: int = f(3, "Retries per request on connection errors and 5xx.")
    setup_timeout: float = f(120.0, "Seconds to wait for servers to become healthy.")
    max_batch_size: int = f(64, "Embedded server: maximum sequences decoded together.")
    device: str = f("cpu", "Embedded server device (cpu or cuda).")

    def __post_init__(self) -> None:
        _choice(self.backend, "backend", ("embedded", "sglang", "remote"))
        _choice(self.schedule, "schedule", ("round_robin", "least_loaded"))
        _check(self.num_servers >= 1, "num_servers", f"must be >= 1 (got {self.num_servers})")
        _check(self.request_timeout > 0, "request_timeout", f"must be > 0 (got {self.request_timeout})")
        _check(self.request_retries >= 0, "request_retries", f"must be >= 0 (got {self.request_retries})")
        _check(self.max_batch_size >= 1, "max_batch_size", f"must be >= 1 (got {self.max_batch_size})")
        _check(
            self.backend != "remote" or bool(self.addresses),
            "addresses",
            "backend 'remote' needs at least one host:port in inference.addresses",
        )
        if self.backend == "sglang":
            _check_sglang_version("backend")


@dataclass
class RolloutConfig:
    """The asynchronous rollout executor."""

    batch_size: int = f(16, "Prompts (groups) per training step.")
    group_size: int = f(8, "Episodes per prompt, for group baselines (GRPO, RLOO).")
    max_concurrent_rollouts: int = f(128, "Episodes in flight at once.")
    max_head_offpolicyness: int = f(2, "Staleness bound eta: 0 = synchronous RL.")
    group_filter: str = f("none", "none | nonzero_std (drop groups whose rewards are all equal).")
    failure_policy: str = f("drop", "Failed episodes: drop | zero (keep with reward 0).")
    episode_timeout: float = f(600.0, "Seconds before an episode is cancelled as timeout.")
    reward_timeout: float = f(10.0, "Seconds one reward call may take.")
    reward_workers: int | None = f(None, "Reward worker processes (calls run at once); None = one per CPU core, at most 8.")
    output_path: str | None = f(None, "mode=rollout: JSONL file to write (default: run dir).")
    num_episodes: int = f(256, "mode=rollout: number of episodes to write.")
    no_signal_warn_steps: int = f(5, "Warn once when every group's rewards are equal for this many steps in a "
                                     "row (no learning signal); 0 disables.")

    def __post_init__(self) -> None:
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1 (got {self.batch_size})")
        _check(self.no_signal_warn_steps >= 0, "no_signal_warn_steps", f"must be >= 0 (got {self.no_signal_warn_steps})")
        _check(self.group_size >= 1, "group_size", f"must be >= 1 (got {self.group_size})")
        _check(
            self.max_concurrent_rollouts >= 1,
            "max_concurrent_rollouts",
            f"must be >= 1 (got {self.max_concurrent_rollouts})",
        )
        _check(
            self.max_head_offpolicyness >= 0,
            "max_head_offpolicyness",
            f"must be >= 0 (got {self.max_head_offpolicyness})",
        )
        _choice(self.group_filter, "group_filter", ("none", "nonzero_std"))
        _choice(self.failure_policy, "failure_policy", ("drop", "zero"))
        _check(self.reward_timeout > 0, "reward_timeout", f"must be > 0 (got {self.reward_timeout})")
        _check(self.reward_workers is None or self.reward_workers >= 1, "reward_workers",
               f"must be >= 1, or null for one per CPU core (got {self.reward_workers})")
        _check(self.episode_timeout > 0, "episode_timeout", f"must be > 0 (got {self.episode_timeout})")
        _check(
            self.max_concurrent_rollouts >= self.group_size,
            "max_concurrent_rollouts",
            f"must be >= group_size={self.group_size} (a group is launched as a whole; got {self.max_concurrent_rollouts})",
        )
        _check(self.group_filter != "nonzero_std" or self.group_size >= 2, "group_filter",
               "nonzero_std needs rollout.group_size >= 2")


@dataclass
class ActorConfig:
    """The policy model and its optimiser."""

    path: str | None = f(None, "HF model dir; None builds the tiny default model (cached).")
    dtype: str = f("float32", "Parameter/compute dtype: float32 (CPU) or bfloat16 (GPU).")
    grad_reduce_dtype: str = f("float32", "Dtype of gradient reduction across ranks.")
    lr: float = f(2e-4, "AdamW learning rate (tuned for the tiny default model; ~1e-6 suits billion-parameter models).")
    weight_decay: float = f(0.0, "AdamW weight decay.")
    betas: list[float] = f([0.9, 0.999], "AdamW betas.")
    warmup_steps: int = f(10, "Linear warmup steps (Adam's first full-size steps knock a warm-started policy back without one).")
    lr_schedule: str = f("cosine", "constant | cosine (after warmup, down to min_lr_ratio).")
    min_lr_ratio: float = f(0.1, "Cosine schedule floor as a fraction of lr.")
    max_grad_norm: float = f(1.0, "Gradient-norm clip; 0 disables.")
    gradient_checkpointing: bool = f(False, "Recompute activations in backward to save memory.")
    max_tokens_per_mb: int = f(8192, "Token budget of one micro-batch.")
    hsdp_replicate: int = f(1, "HSDP replicas: mesh is (replicate, world/replicate); 1 = full sharding.")
    init_critic_from_actor: bool = f(True, "PPO: initialise the critic body from the actor.")
    critic_lr: float = f(1e-4, "PPO critic learning rate.")

    def __post_init__(self) -> None:
        _choice(self.dtype, "dtype", DTYPES)
        _choice(self.grad_reduce_dtype, "grad_reduce_dtype", DTYPES)
        _check(self.lr > 0, "lr", f"must be > 0 (got {self.lr})")
        _check(len(self.betas) == 2, "betas", f"must be two floats (got {self.betas})")
        _choice(self.lr_schedule, "lr_schedule", ("constant", "cosine"))
        _check(self.max_grad_norm >= 0, "max_grad_norm", f"must be >= 0 (got {self.max_grad_norm})")
        _check(self.max_tokens_per_mb >= 1, "max_tokens_per_mb", f"must be >= 1 (got {self.max_tokens_per_mb})")
        _check(self.hsdp_replicate >= 1, "hsdp_replicate", f"must be >= 1 (got {self.hsdp_replicate})")


@dataclass
class AlgorithmConfig:
    """The RL algorithm: a named advantage estimator + loss, and their knobs."""

    name: str = f("grpo", "Registered algorithm (see `areal-agents list algorithms`).")
    eps_clip: float = f(0.2, "PPO ratio clip (low side, and high side unless eps_clip_high is set).")
    eps_clip_high: float | None = f(None, "DAPO clip-higher upper epsilon.")
    c_clip: float | None = f(None, "Dual-clip constant (> 1) bounding negative-advantage losses.")
    use_decoupled_loss: bool = f(True, "AReaL decoupled PPO: ratio against proximal logprobs.")
    recompute_logprob: bool = f(True, "Recompute proximal logprobs with the current weights before training.")
    behav_imp_weight_cap: float | None = f(5.0, "Mask tokens whose behaviour importance weight exceeds this.")
    kl_ctl: float = f(0.0, "KL-to-reference coefficient; 0 disables the reference model.")
    kl_estimator: str = f("k3", "KL estimator: k1 | k2 | k3.")
    kl_in_reward: bool = f(False, "Apply KL as a token reward penalty instead of a loss term.")
    entropy_coef: float = f(0.0, "Entropy bonus coefficient (entropy is always logged).")
    loss_agg_mode: str = f("token-mean", "token-mean | seq-mean-token-mean | seq-mean-token-sum-norm.")
    group_std_norm: bool = f(True, "GRPO: divide group-centred rewards by the group std.")
    adv_eps: float = f(1e-6, "Epsilon added to std in normalisations.")
    credit: str = f("trajectory", "Multi-turn credit: trajectory (episode return) | turn (per-turn G_t).")
    rebn: bool = f(False, "Return batch normalisation over the batch.")
    gamma: float = f(1.0, "PPO/GAE discount over tokens.")
    lam: float = f(1.0, "GAE lambda.")
    value_eps_clip: float = f(0.2, "PPO value-loss clip.")
    reward_scaling: float = f(1.0, "Reward multiplier (after bias).")
    reward_bias: float = f(0.0, "Reward offset added before scaling.")
    reward_clip: float = f(20.0, "Clip shaped rewards to [-reward_clip, reward_clip].")
    mask_no_eos_with_zero: bool = f(False, "Zero the reward of responses cut at max length.")
    overlong_tokens: int | None = f(None, "DAPO overlong penalty: soft window in tokens before the cap.")
    overlong_penalty_factor: float = f(1.0, "DAPO overlong penalty at the cap.")
    max_response_tokens: int | None = f(
        None, "Response length cap L_max for the DAPO overlong penalty; None takes agent.max_tokens."
    )
    ppo_n_minibatches: int = f(1, "Optimiser steps per training batch.")

    def __post_init__(self) -> None:
        _check(self.eps_clip > 0, "eps_clip", f"must be > 0 (got {self.eps_clip})")
        _check(
            self.eps_clip_high is None or self.eps_clip_high > 0,
            "eps_clip_high",
            f"must be > 0 (got {self.eps_clip_high})",
        )
        _check(self.c_clip is None or self.c_clip > 1, "c_clip", f"must be > 1 when set (got {self.c_clip})")
        _check(
            not self.use_decoupled_loss or self.recompute_logprob,
            "recompute_logprob",
            "the decoupled loss needs proximal logprobs: set algorithm.recompute_logprob=true "
            "(or algorithm.use_decoupled_loss=false)",
        )
        _check(
            self.behav_imp_weight_cap is None or self.behav_imp_weight_cap > 1,
            "behav_imp_weight_cap",
            f"must be > 1 when set (got {self.behav_imp_weight_cap})",
        )
        _check(self.kl_ctl >= 0, "kl_ctl", f"must be >= 0 (got {self.kl_ctl})")
        _choice(self.kl_estimator, "kl_estimator", ("k1", "k2", "k3"))
        _choice(self.loss_agg_mode, "loss_agg_mode", ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"))
        _choice(self.credit, "credit", ("trajectory", "turn"))
        _check(0.0 < self.gamma <= 1.0, "gamma", f"must be in (0, 1] (got {self.gamma})")
        _check(0.0 <= self.lam <= 1.0, "lam", f"must be in [0, 1] (got {self.lam})")
        _check(self.reward_clip > 0, "reward_clip", f"must be > 0 (got {self.reward_clip})")
        _check(
            self.overlong_tokens is None or self.overlong_tokens >= 1,
            "overlong_tokens",
            f"must be >= 1 when set (got {self.overlong_tokens})",
        )
        _check(
            self.overlong_penalty_factor >= 0,
            "overlong_penalty_factor",
            f"must be >= 0 (got {self.overlong_penalty_factor})",
        )
        _check(
            self.max_response_tokens is None or self.max_response_tokens >= 1,
            "max_response_tokens",
            f"must be >= 1 when set (got {self.max_response_tokens})",
        )
        _check(self.ppo_n_minibatches >= 1, "ppo_n_minibatches", f"must be >= 1 (got {self.ppo_n_minibatches})")


@dataclass
class SFTConfig:
    """Supervised fine-tuning (also the warm start of the tiny default model)."""

    steps: int = f(1000, "Optimiser steps of `areal-agents sft`.")
    batch_size: int = f(64, "Examples per step.")
    lr: float = f(1e-3, "Peak learning rate (cosine decay after warmup).")
    warm_start_steps: int = f(1000, "Most steps of the partial SFT `run` does without actor.path (it stops earlier "
                                   "at warm_start_target, leaving RL room to learn).")
    warm_start_lr: float = f(1e-3, "Peak learning rate of that warm start.")
    warm_start_target: float = f(0.4, "The warm start stops at the first check whose greedy accuracy on the eval rows "
                                      "is >= this; 0 trains all warm_start_steps.")
    warm_start_check_every: int = f(5, "Steps between those checks.")
    warmup_steps: int = f(30, "Linear warmup steps.")
    eval_every: int = f(200, "Greedy eval every N steps; 0 disables.")
    output_dir: str | None = f(None, "Where to save; None uses the cache dir of the default model.")

    def __post_init__(self) -> None:
        _check(self.steps >= 0, "steps", f"must be >= 0 (got {self.steps})")
        _check(self.batch_size >= 1, "batch_size", f"must be >= 1 (got {self.batch_size})")
        _check(self.lr > 0, "lr", f"must be > 0 (got {self.lr})")
        _check(self.warm_start_steps >= 0, "warm_start_steps", f"must be >= 0 (got {self.warm_start_steps})")
        _check(self.warm_start_lr > 0, "warm_start_lr", f"must be > 0 (got {self.warm_start_lr})")
        _check(0.0 <= self.warm_start_target <= 1.0, "warm_start_target",
               f"must be in [0, 1] (got {self.warm_start_target})")
        _check(self.warm_start_check_every >= 1, "warm_start_check_every",
               f"must be >= 1 (got {self.warm_start_check_every})")


@dataclass
class TrainerConfig:
    """The RL loop: length, checkpoints, weight sync, ranks."""

    total_steps: int = f(200, "Training steps (one weight version each).")
    save_every: int = f(10, "Checkpoint every N steps; 0 disables.")
    recover: str = f("auto", "auto (resume the last complete checkpoint if any) | disabled.")
    weight_sync: str = f("disk", "disk (/update_weights_from_disk) | gloo (broadcast to embedded servers) | "
                                 "nccl (broadcast to SGLang on GPUs); a failed broadcast falls back to disk.")
    weight_sync_address: str = f("127.0.0.1", "Trainer address the servers join for gloo/nccl weight sync "
                                              "(this host's IP when they run on other hosts).")
    nproc: int = f(1, "Trainer ranks; > 1 launches torchrun.")
    device: str = f("cpu", "Trainer device: cpu | cuda.")
    first_gpu: int | None = f(None, "GPU of trainer local rank 0 (rank r takes first_gpu + r); None = the GPU "
                                    "after those of the SGLang servers the run launches, else 0.")
    max_time_s: float | None = f(None, "Stop training after this many seconds (then eval and save).")

    def __post_init__(self) -> None:
        _check(self.total_steps >= 0, "total_steps", f"must be >= 0 (got {self.total_steps})")
        _check(self.save_every >= 0, "save_every", f"must be >= 0 (got {self.save_every})")
        _choice(self.recover, "recover", ("auto", "disabled"))
        _choice(self.weight_sync, "weight_sync", ("disk", "gloo", "nccl"))
        _check(self.nproc >= 1, "nproc", f"must be >= 1 (got {self.nproc})")
        _choice(self.device, "device", ("cpu", "cuda"))
        _check(self.first_gpu is None or self.first_gpu >= 0, "first_gpu", f"must be >= 0 (got {self.first_gpu})")


@dataclass
class EvalConfig:
    """Greedy / pass@k evaluation on the env's test split."""

    every: int = f(20, "Evaluate every N training steps; 0 = only before and after.")
    n: int | None = f(None, "Test rows to evaluate; None = all of data.test_size.")
    k: int = f(1, "pass@k samples per row (k > 1 samples at temperature eval.temperature).")
    temperature: float = f(1.0, "Sampling temperature for pass@k (greedy pass@1 is always reported).")

    def __post_init__(self) -> None:
        _check(self.every >= 0, "every", f"must be >= 0 (got {self.every})")
        _check(self.k >= 1, "k", f"must be >= 1 (got {self.k})")


@dataclass
class LoggingConfig:
    """What a run writes and shows."""

    tensorboard: bool = f(True, "Write TensorBoard events (needs the tensorboard package).")
    wandb: bool = f(False, "Log to Weights & Biases (pip install 'areal-agents[wandb]').")
    wandb_project: str = f("areal-agents", "W&B project name.")
    samples_per_step: int = f(4, "Sample trajectories written per step.")
    plots: bool = f(True, "Write PNG plots at the end of a run.")
    progress: bool = f(True, "Show rich progress bars.")


@dataclass
class ExperimentConfig:
    """One experiment: every section, loaded from YAML plus key=value overrides."""

    experiment_name: str | None = f(None, "Groups trials under runs/<experiment_name>/; None = the env's name.")
    trial_name: str = f("trial", "Output dir is runs/<experiment_name>/<trial_name>/.")
    output_dir: str = f("runs", "Root directory of run outputs.")
    mode: str = f("full", "full (rollout + train) | rollout (write JSONL) | train (from JSONL).")
    train_data: str | None = f(None, "mode=train: rollout JSONL to train from.")
    seed: int = f(1, "Global seed.")
    imports: list[str] = f([], "Modules or .py files imported first, to register custom envs/agents/algorithms.")
    allocation_mode: str | None = f(None, "Device split shorthand: 'sglang.d2t2+d4' = 2 SGLang servers x TP 2 "
                                          "(GPUs 0-3) + 4 trainer ranks (GPUs 4-7); sets inference.backend/"
                                          "num_servers, sglang.tp_size, trainer.nproc/device.")
    env: EnvConfig = field(default_factory=EnvConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    data: DataConfig = field(default_factory=DataConfig)
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    actor: ActorConfig = field(default_factory=ActorConfig)
    sglang: SGLangConfig = field(default_factory=SGLangConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    sft: SFTConfig = field(default_factory=SFTConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    logging: LoggingConfig = field(default_factory=LoggingConfig)

    def __post_init__(self) -> None:
        _choice(self.mode, "mode", ("full", "rollout", "train"))
        if self.experiment_name is None and dataclasses.is_dataclass(self.env):
            self.experiment_name = self.env.name  # runs of different envs never share a run dir
        _check(
            self.mode != "train" or self.train_data is not None,
            "train_data",
            "mode=train needs train_data=<rollout JSONL>",
        )
        if dataclasses.is_dataclass(self.actor) and dataclasses.is_dataclass(self.trainer):
            _check(
                self.trainer.nproc % self.actor.hsdp_replicate == 0,
                "actor.hsdp_replicate",
                f"must divide trainer.nproc={self.trainer.nproc} (got {self.actor.hsdp_replicate})",
            )
        if dataclasses.is_dataclass(self.trainer) and dataclasses.is_dataclass(self.inference):
            sync, backend = self.trainer.weight_sync, self.inference.backend
            _check(not (sync == "gloo" and backend == "sglang"), "trainer.weight_sync",
                   "gloo is for embedded servers; SGLang on GPUs takes nccl (or disk)")
            _check(not (sync == "nccl" and backend == "embedded"), "trainer.weight_sync",
                   "nccl needs SGLang servers on GPUs; embedded servers take gloo (or disk)")
            loopback = ("127.0.0.1", "localhost", "::1", "[::1]")
            hosts = (a.rsplit(":", 1)[0].split("//")[-1] for a in self.inference.addresses)
            far = [h for h in hosts if h not in loopback] if sync != "disk" and backend == "remote" else []
            _check(not far or self.trainer.weight_sync_address not in loopback, "trainer.weight_sync_address",
                   f"servers on other hosts ({', '.join(far)}) cannot join a {sync} group at "
                   f"{self.trainer.weight_sync_address}: set this host's address")
        if dataclasses.is_dataclass(self.algorithm) and dataclasses.is_dataclass(self.agent):
            if self.algorithm.max_response_tokens is None:  # L_max of the overlong penalty
                self.algorithm.max_response_tokens = self.agent.max_tokens

    @property
    def trainer_first_gpu(self) -> int:
        """GPU of trainer local rank 0: ``trainer.first_gpu``, else the first GPU after the
        ``num_servers × tp_size`` GPUs of the SGLang servers this run launches (they start at 0)."""
        if self.trainer.first_gpu is not None:
            return self.trainer.first_gpu
        return self.inference.num_servers * self.sglang.tp_size if self.inference.backend == "sglang" else 0

    @property
    def run_dir(self) -> str:
        import os

        return os.path.join(self.output_dir, self.experiment_name or self.env.name, self.trial_name)
