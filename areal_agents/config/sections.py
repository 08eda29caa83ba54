"""The sections of the experiment config: env, agent, data, sampling, inference, rollout, actor, algorithm, ..."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from areal_agents.config.fields import (
    ConfigError,
    Rule,
    Section,
    f,
    ge,
    gt,
    one_of,
    within,
)
from areal_agents.config.vocabulary import (
    CREDITS,
    DTYPES,
    IMP_WEIGHT_CORRECTIONS,
    IMP_WEIGHT_MODES,
    KL_ESTIMATORS,
    LOSS_AGG_MODES,
)
from areal_agents.types import is_turn_discount

__all__ = [
    "ActorConfig",
    "AgentConfig",
    "AlgorithmConfig",
    "DataConfig",
    "EnvConfig",
    "EvalConfig",
    "InferenceConfig",
    "LoggingConfig",
    "LoraConfig",
    "OnlineConfig",
    "RayConfig",
    "RolloutConfig",
    "SFTConfig",
    "SGLangConfig",
    "SamplingConfig",
    "TrainerConfig",
]


@dataclass
class EnvConfig(Section):
    """Which environment to play and how its rewards are discounted."""

    name: str = f("math", "Registered env name (see `areal-agents list envs`).")
    kwargs: dict[str, Any] = f({}, "Extra keyword arguments passed to the env constructor.")
    turn_discount: float = f(1.0, "Discount per turn of the env's rewards: an episode's return is sum_k "
                                  "turn_discount^k r_k over its turns k = 0, 1, ... (the per-token discount of the "
                                  "token-level returns is algorithm.token_discount).",
                             Rule(is_turn_discount, "in (0, 1]"))


@dataclass
class AgentConfig(Section):
    """The agent loop that plays the env."""

    name: str = f("chat", "Registered agent name (see `areal-agents list agents`).")
    max_turns: int = f(4, "Maximum LLM turns per episode.", ge(1))
    max_tokens: int = f(1024, "Maximum generated tokens per episode over all turns.", ge(1))
    system_prompt: str | None = f(None, "Optional system message prepended to every episode.")
    kwargs: dict[str, Any] = f({}, "Extra keyword arguments passed to the agent constructor.")
    trajectory_mode: str | None = f(
        None, "OpenAI-style agents: how calls become trajectories. 'concat': calls whose prompts extend "
              "each other form one multi-turn trajectory; 'individual': each call is a sample of its own "
              "(reward * turn_discount**calls_after_it), for sub-agents or context compaction. None: the "
              "agent's own trajectory_mode attribute, else 'concat'.",
        one_of("concat", "individual"))


@dataclass
class DataConfig(Section):
    """Where training and evaluation prompts come from."""

    name: str | None = f(None, "Registered dataset name; None uses the env's default dataset.")
    path: str | None = f(None, "Local JSONL/Parquet file, for datasets that read one.")
    train_size: int = f(2000, "Number of training rows (synthetic datasets).", ge(1))
    test_size: int = f(500, "Number of evaluation rows (synthetic datasets).", ge(0))
    shuffle: bool = f(True, "Shuffle training rows each epoch (seeded).")
    kwargs: dict[str, Any] = f({}, "Extra keyword arguments passed to the dataset factory.")


@dataclass
class SamplingConfig(Section):
    """Sampling parameters sent to the inference server for training rollouts."""

    max_new_tokens: int = f(32, "Maximum new tokens per LLM turn.", ge(1))
    temperature: float = f(1.0, "Sampling temperature; logprobs are log_softmax(logits / temperature).", ge(0))
    top_p: float = f(1.0, "Nucleus sampling threshold.", within("(0, 1]"))
    top_k: int = f(-1, "Top-k sampling; -1 disables.", Rule(lambda v: v == -1 or v >= 1, "-1 or >= 1"))
    stop: list[str] = f([], "Stop strings that end a turn.")


@dataclass
class SGLangConfig(Section):
    """Launch options for SGLang servers (inference.backend=sglang)."""

    dtype: str = f("${actor.dtype}", "Server weight dtype; defaults to actor.dtype.", one_of(*DTYPES))
    tp_size: int = f(1, "Tensor-parallel size per server.", ge(1))
    mem_fraction_static: float = f(0.8, "Fraction of GPU memory SGLang reserves for weights and KV cache.",
                                   within("(0, 1)"))
    random_seed: int = f(1, "Server sampling seed.")
    extra_args: list[str] = f([], "Extra command-line arguments for sglang.launch_server.")


@dataclass
class InferenceConfig(Section):
    """Inference servers: embedded (CPU default), SGLang, or already-running ones."""

    backend: str = f("embedded", "Servers; remote attaches to inference.addresses.", one_of("embedded", "sglang", "remote"))
    addresses: list[str] = f([], "host:port of running servers (backend=remote).")
    num_servers: int = f(1, "Servers to launch (data parallel).", ge(1))
    host: str = f("127.0.0.1", "Interface launched servers bind to.")
    schedule: str = f("round_robin", "Server choice per episode.", one_of("round_robin", "least_loaded"))
    request_timeout: float = f(300.0, "Seconds one /generate request may take, retries on other servers included; "
                               "past it the request fails with a one-line error (the episode: server_error).", gt(0))
    request_retries: int = f(3, "Retries per request on connection errors and 5xx.", ge(0))
    batch_window: float = f(0.002, "Seconds a /generate request waits for others bound to the same server (a "
                            "group's samples) to share one batched POST (streamed by the embedded server: each reply "
                            "as it finishes); 0 sends each request alone.", ge(0))
    setup_timeout: float = f(120.0, "Seconds to wait for servers to become healthy.")
    max_batch_size: int = f(256, "Embedded server: maximum sequences decoded together (an eval sends as many "
                            "episodes at once to each server).", ge(1))
    device: str = f("cpu", "Embedded server device (cpu or cuda).")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend == "sglang":
            from areal_agents.inference.sglang_version import sglang_version_problem

            if (problem := sglang_version_problem()) is not None:
                raise ConfigError("backend", problem)

    def rules(self) -> list[tuple[bool, str, str]]:
        return [(self.backend != "remote" or bool(self.addresses), "addresses",
                 "backend 'remote' needs at least one host:port in inference.addresses")]


@dataclass
class RolloutConfig(Section):
    """The asynchronous rollout executor."""

    batch_size: int = f(16, "Prompts (groups) per training step.", ge(1))
    group_size: int = f(8, "Episodes per prompt, for group baselines (GRPO, RLOO).", ge(1))
    max_concurrent_rollouts: int = f(128, "Episodes in flight at once.", ge(1))
    max_head_offpolicyness: int = f(2, "Staleness bound eta: 0 = synchronous RL.", ge(0))
    group_filter: str = f("none", "nonzero_std drops groups whose rewards are all equal.", one_of("none", "nonzero_std"))
    skip_no_signal: float = f(0.0, "Chance that a row whose last group every sample solved (so the group filter "
                                   "dropped it) is skipped when its turn comes again (its group would likely be "
                                   "generated only to be dropped); rows no sample solved keep coming, as they are "
                                   "what is left to learn. 0 disables, and below 1 every row comes back.",
                              within("[0, 1)"))
    failure_policy: str = f("drop", "Failed episodes: drop, or zero (keep with reward 0).", one_of("drop", "zero"))
    episode_timeout: float = f(600.0, "Seconds before an episode is cancelled as timeout.", gt(0))
    group_reward: str | None = f(None, "A registered group reward (register_reward over a group_reward function, or a "
                                       "GroupJudge) that scores each finished group in one call; its scores replace "
                                       "the episodes' last-turn rewards. None: the env's rewards alone.")
    reward_timeout: float = f(10.0, "Seconds one reward call may take.", gt(0))
    reward_workers: int | None = f(None, "Reward worker processes (calls run at once); None = one per CPU core, "
                                         "at most 8.", ge(1))
    process: bool = f(True, "Run episodes in a process of their own, so that the trainer never waits on their "
                            "Python; false: on a thread of the trainer's rank 0.")
    output_path: str | None = f(None, "mode=rollout: JSONL file to write (default: run dir).")
    num_episodes: int = f(256, "mode=rollout: number of episodes to write.")
    no_signal_warn_steps: int = f(5, "Warn once when every group's rewards are equal for this many steps in a "
                                     "row (no learning signal); 0 disables.", ge(0))

    def rules(self) -> list[tuple[bool, str, str]]:
        return [
            (self.max_concurrent_rollouts >= self.group_size, "max_concurrent_rollouts",
             f"must be >= group_size={self.group_size} (a group is launched as a whole; "
             f"got {self.max_concurrent_rollouts})"),
            (self.group_filter != "nonzero_std" or self.group_size >= 2, "group_filter",
             "nonzero_std needs rollout.group_size >= 2"),
            (self.skip_no_signal == 0 or self.group_filter != "none", "skip_no_signal",
             "needs a rollout.group_filter (it skips rows whose group the filter dropped)"),
        ]


@dataclass
class OnlineConfig(Section):
    """mode=online: the gateway through which agents outside the run open sessions, call the model and post
    rewards (docs/online.md)."""

    host: str = f("127.0.0.1", "Address the gateway binds; anything but loopback is reachable from other "
                               "machines (a warning says so).")
    port: int = f(8400, "Gateway port; 0 = any free port (RUN_DIR/gateway.json says which).", within("[0, 65535]"))
    admin_key_env: str = f("AREAL_AGENTS_ADMIN_KEY", "Environment variable holding the admin key (opens sessions).")
    admin_key_file: str | None = f(None, "File holding the admin key, when the variable is unset; with neither, "
                                         "a fresh key is written to RUN_DIR/admin_key (mode 600).")
    session_ttl: float = f(600.0, "Seconds after a session's last call (or its opening) within which its reward "
                                  "may come; later it is dropped as expired.", gt(0))
    max_open_sessions: int = f(1024, "Sessions open at once; more are refused with 429.", ge(1))
    admission: str = f("open", "open: any session up to max_open_sessions (those the trainer cannot take within "
                               "rollout.max_head_offpolicyness versions are dropped as stale); bounded: refuse new "
                               "ones with 429 while they could not be (the staleness bound of a dataset run).",
                       one_of("open", "bounded"))
    max_request_bytes: int = f(4 * 1024**2, "Largest request body the gateway reads (413 beyond).", ge(1024))
    batch_sessions: int | None = f(None, "Rewarded sessions per training step; None = rollout.batch_size x "
                                         "rollout.group_size.", ge(1))


@dataclass
class LoraConfig(Section):
    """LoRA adapters on the policy (PEFT): only they are trained, checkpointed, synced and served."""

    rank: int = f(0, "Adapter rank r; 0 = off (full fine-tuning).", ge(0))
    alpha: float = f(16.0, "LoRA alpha: the adapter's output is scaled by alpha / rank.", gt(0))
    dropout: float = f(0.0, "Dropout on the adapter's input while training.", within("[0, 1)"))
    target_modules: list[str] = f(["all-linear"], "Module names (or suffixes) that get adapters; all-linear = every "
                                                  "linear layer but the output head.",
                                  Rule(lambda v: len(v) > 0 and all(isinstance(m, str) and m for m in v),
                                       "a non-empty list of module names"))
    name: str = f("policy", "Name the servers load the adapter under (the lora_path of /generate).",
                  Rule(lambda v: bool(v) and "/" not in v, "a non-empty name without '/'"))

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    @property
    def served(self) -> str | None:
        """The ``lora_path`` of the policy's ``/generate`` requests: the adapter's name, or None without LoRA."""
        return self.name if self.enabled else None


@dataclass
class ActorConfig(Section):
    """The policy model and its optimiser."""

    path: str | None = f(None, "HF model dir; None builds the tiny default model (cached).")
    dtype: str = f("float32", "Parameter/compute dtype: float32 (CPU) or bfloat16 (GPU).", one_of(*DTYPES))
    grad_reduce_dtype: str = f("float32", "Dtype of gradient reduction across ranks.", one_of(*DTYPES))
    lr: float = f(2e-4, "AdamW learning rate (tuned for the tiny default model; ~1e-6 suits billion-parameter "
                        "models).", gt(0))
    weight_decay: float = f(0.0, "AdamW weight decay.")
    betas: list[float] = f([0.9, 0.999], "AdamW betas.", Rule(lambda v: len(v) == 2, "two floats"))
    warmup_steps: int = f(10, "Linear warmup steps (Adam's first full-size steps knock a warm-started policy back "
                              "without one).")
    lr_schedule: str = f("cosine", "After warmup: constant, or cosine down to min_lr_ratio.", one_of("constant", "cosine"))
    min_lr_ratio: float = f(0.1, "Cosine schedule floor as a fraction of lr.")
    max_grad_norm: float = f(1.0, "Gradient-norm clip; 0 disables.", ge(0))
    gradient_checkpointing: bool = f(False, "Recompute activations in backward to save memory.")
    max_tokens_per_mb: int = f(8192, "Token budget of one micro-batch.", ge(1))
    pack_prompts: bool = f(True, "Training forward passes run each prefix that samples share (a group's prompt, "
                                 "a multi-turn group's common first turns) once, as a token trie with a tree "
                                 "attention mask, when that is cheaper: same numbers, fewer tokens.")
    hsdp_replicate: int = f(1, "HSDP replicas: mesh is (replicate, world/replicate); 1 = full sharding.", ge(1))
    init_critic_from_actor: bool = f(True, "PPO: initialise the critic body from the actor.")
    critic_lr: float = f(1e-4, "PPO critic learning rate.")
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class AlgorithmConfig(Section):
    """The RL algorithm: a named advantage estimator + loss, and their knobs."""

    name: str = f("grpo", "Registered algorithm (see `areal-agents list algorithms`).")
    eps_clip: float = f(0.2, "PPO ratio clip (low side, and high side unless eps_clip_high is set).", gt(0))
    eps_clip_high: float | None = f(None, "DAPO clip-higher upper epsilon.", gt(0))
    c_clip: float | None = f(None, "Dual-clip constant bounding negative-advantage losses.", gt(1))
    use_decoupled_loss: bool = f(True, "AReaL decoupled PPO: ratio against proximal logprobs.")
    recompute_logprob: bool = f(True, "Recompute proximal logprobs with the current weights before training.")
    behav_imp_weight_cap: float | None = f(5.0, "Cap C of the behaviour importance weight (trainer vs inference "
                                                "server logprobs); a weight above it is masked or truncated, see "
                                                "behav_imp_weight_correction (None: no cap).", gt(1))
    behav_imp_weight_mode: str = f("auto", "Rollout-trainer mismatch correction: multiply each token's policy "
                                           "gradient by w = exp(prox_logp - logprobs) per token, or by one weight "
                                           "per sequence (exp of the sum over its generated tokens); none disables; "
                                           "auto: token with use_decoupled_loss, else none.",
                                   one_of("auto", *IMP_WEIGHT_MODES))
    behav_imp_weight_correction: str = f("mask", "A weight above behav_imp_weight_cap: mask zeroes it (the token, "
                                                 "or the whole sequence), truncate clips it to the cap.",
                                         one_of(*IMP_WEIGHT_CORRECTIONS))
    kl_ctl: float = f(0.0, "KL-to-reference coefficient; 0 disables the reference model.", ge(0))
    kl_estimator: str = f("k3", "KL estimator.", one_of(*KL_ESTIMATORS))
    kl_in_reward: bool = f(False, "Apply KL as a token reward penalty instead of a loss term.")
    entropy_coef: float = f(0.0, "Entropy bonus coefficient (entropy is always logged).")
    loss_agg_mode: str = f("token-mean", "How token losses are averaged.", one_of(*LOSS_AGG_MODES))
    group_std_norm: bool = f(True, "GRPO: divide group-centred rewards by the group std.")
    adv_eps: float = f(1e-6, "Epsilon added to std in normalisations.")
    credit: str = f("trajectory", "Multi-turn credit: trajectory (episode return) or turn (per-turn G_t).",
                    one_of(*CREDITS))
    step_adv_weight: float = f(1.0, "GiGPO (algorithm gigpo): weight w of the step-level advantage, each turn's G_t "
                                    "normalised among the group's turns from the same env state.", ge(0))
    rebn: bool = f(False, "Return batch normalisation over the batch.")
    token_discount: float = f(1.0, "Discount per generated token of the token-level returns (reinforce, reinforce++ "
                                   "and PPO's GAE); prompt and env tokens do not count. Per-turn discounting of the "
                                   "env's rewards is env.turn_discount.", within("(0, 1]"))
    gae_lambda: float = f(1.0, "PPO's GAE lambda: 1 gives Monte Carlo advantages, 0 one-step TD ones.",
                          within("[0, 1]"))
    value_eps_clip: float = f(0.2, "PPO value-loss clip.")
    reward_scaling: float = f(1.0, "Reward multiplier (after bias).")
    reward_bias: float = f(0.0, "Reward offset added before scaling.")
    reward_clip: float = f(20.0, "Clip shaped rewards to [-reward_clip, reward_clip].", gt(0))
    mask_no_eos_with_zero: bool = f(False, "Zero the reward of responses cut at max length.")
    overlong_tokens: int | None = f(None, "DAPO overlong penalty: soft window in tokens before the cap.", ge(1))
    overlong_penalty_factor: float = f(1.0, "DAPO overlong penalty at the cap.", ge(0))
    max_response_tokens: int | None = f(
        None, "Response length cap L_max for the DAPO overlong penalty; None takes agent.max_tokens.", ge(1)
    )
    ppo_n_minibatches: int = f(1, "Optimiser steps per training batch.", ge(1))

    @property
    def imp_weight_mode(self) -> str:
        """``behav_imp_weight_mode`` with auto resolved: token under the decoupled loss, else none."""
        if self.behav_imp_weight_mode != "auto":
            return self.behav_imp_weight_mode
        return "token" if self.use_decoupled_loss else "none"

    def rules(self) -> list[tuple[bool, str, str]]:
        mode, cap = self.imp_weight_mode, self.behav_imp_weight_cap
        return [
            (not self.use_decoupled_loss or self.recompute_logprob, "recompute_logprob",
             "the decoupled loss needs proximal logprobs: set algorithm.recompute_logprob=true "
             "(or algorithm.use_decoupled_loss=false)"),
            (not (self.use_decoupled_loss and mode == "none"), "behav_imp_weight_mode",
             "none contradicts use_decoupled_loss=true, whose behaviour weight this is: set token or sequence "
             "(or algorithm.use_decoupled_loss=false for PPO against the recomputed logprobs)"),
            (mode == "none" or self.recompute_logprob, "behav_imp_weight_mode",
             f"{mode} needs the trainer's own logprobs: set algorithm.recompute_logprob=true"),
            (mode != "sequence" or cap is not None, "behav_imp_weight_cap",
             "behav_imp_weight_mode=sequence needs a cap (a product of per-token ratios has no useful bound)"),
            (mode == "none" or self.behav_imp_weight_correction != "truncate" or cap is not None,
             "behav_imp_weight_cap", "behav_imp_weight_correction=truncate needs a cap to truncate at"),
        ]


@dataclass
class SFTConfig(Section):
    """Supervised fine-tuning (also the warm start of the tiny default model)."""

    steps: int = f(1000, "Optimiser steps of `areal-agents sft`.", ge(0))
    batch_size: int = f(64, "Examples per step.", ge(1))
    lr: float = f(1e-3, "Peak learning rate (cosine decay after warmup).", gt(0))
    warm_start_steps: int = f(1000, "Most steps of the partial SFT `run` does without actor.path (it stops earlier "
                                   "at warm_start_target, leaving RL room to learn).", ge(0))
    warm_start_lr: float = f(1e-3, "Peak learning rate of that warm start.", gt(0))
    warm_start_target: float = f(0.4, "The warm start stops at the first check whose greedy accuracy on the eval rows "
                                      "is >= this; 0 trains all warm_start_steps.", within("[0, 1]"))
    warm_start_check_every: int = f(5, "Steps between those checks.", ge(1))
    warm_start_far_check_every: int | None = f(None, "Steps between those checks while the accuracy is under half "
                                                     "the target (None: warm_start_check_every); a curve that jumps "
                                                     "past the target within fewer steps overshoots it.", ge(1))
    warmup_steps: int = f(30, "Linear warmup steps.")
    eval_every: int = f(200, "Greedy eval every N steps; 0 disables.")
    output_dir: str | None = f(None, "Where to save; None uses the cache dir of the default model.")


@dataclass
class TrainerConfig(Section):
    """The RL loop: length, checkpoints, weight sync, ranks."""

    total_steps: int = f(200, "Training steps (one weight version each).", ge(0))
    save_every: int = f(10, "Checkpoint every N steps; 0 disables.", ge(0))
    recover: str = f("auto", "auto resumes the last complete checkpoint if any.", one_of("auto", "disabled"))
    weight_sync: str = f("disk", "disk (/update_weights_from_disk), gloo (broadcast to embedded servers) or "
                                 "nccl (broadcast to SGLang on GPUs); a failed broadcast falls back to disk.",
                         one_of("disk", "gloo", "nccl"))
    weight_sync_address: str = f("127.0.0.1", "Trainer address the servers join for gloo/nccl weight sync "
                                              "(this host's IP when they run on other hosts).")
    weight_sync_timeout: float = f(0.0, "Seconds a gloo/nccl weight sync may take to form its group, then to "
                                        "broadcast one version, before it falls back to disk; 0 sizes it to the "
                                        "model (60 s plus 20 s per billion parameters). A member that dies "
                                        "mid-sync ends it at once, not after this.", ge(0))
    nproc: int = f(1, "Trainer ranks per node; > 1 launches torchrun (launcher=ray: Ray actors).", ge(1))
    nnodes: int = f(1, "Trainer nodes; > 1 runs one torchrun per node that meet at trainer.rdzv_endpoint "
                       "(launcher=ray: nnodes x nproc rank actors).", ge(1))
    rdzv_endpoint: str | None = f(None, "host:port of torchrun's c10d rendezvous when trainer.nnodes > 1.")
    device: str = f("cpu", "Trainer device.", one_of("cpu", "cuda"))
    first_gpu: int | None = f(None, "GPU of trainer local rank 0 (rank r takes first_gpu + r); None = the GPU "
                                    "after those of the SGLang servers the run launches, else 0.", ge(0))
    max_time_s: float | None = f(None, "Stop training after this many seconds (then eval and save).")

    def rules(self) -> list[tuple[bool, str, str]]:
        return [(self.nnodes == 1 or self.rdzv_endpoint is not None, "rdzv_endpoint",
                 f"trainer.nnodes={self.nnodes} needs the rendezvous host:port that every node reaches")]


@dataclass
class RayConfig(Section):
    """launcher=ray: where the servers and trainer ranks go on a Ray cluster."""

    address: str | None = f(None, "Ray cluster to join: host:port of its head, or auto; None starts a local one.")
    strategy: str = f("PACK", "Placement of the servers' bundles and of the trainer ranks' bundles.",
                      one_of("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"))
    separate: bool = f(True, "Servers and trainer ranks on different nodes (when some node has no server).")
    server_resource: str | None = f(None, "Custom node resource each server needs (nodes started with "
                                          "--resources='{\"NAME\": 1}'): pins servers to those nodes.")
    trainer_resource: str | None = f(None, "Custom node resource each trainer rank needs: pins the ranks.")
    cpus_per_server: float = f(1.0, "CPUs reserved per inference server.", gt(0))
    cpus_per_trainer: float = f(1.0, "CPUs reserved per trainer rank (also its torch threads).", gt(0))
    shared_dir: str | None = f(None, "Directory every node sees, for disk weight sync; None = the run dir "
                                     "(then output_dir must be on a shared filesystem).")
    placement_timeout: float = f(60.0, "Seconds to wait for the cluster to place servers and ranks.", gt(0))
    server_restarts: int = f(1, "Times Ray restarts a dead server actor (same node and port).", ge(0))


@dataclass
class EvalConfig(Section):
    """Greedy / pass@k evaluation on the env's test split."""

    every: int = f(20, "Evaluate every N training steps; 0 = only before and after.", ge(0))
    n: int | None = f(None, "Test rows to evaluate; None = all of data.test_size.")
    k: int = f(1, "pass@k samples per row (k > 1 samples at temperature eval.temperature).", ge(1))
    temperature: float = f(1.0, "Sampling temperature for pass@k (greedy pass@1 is always reported).")
    env_kwargs: dict[str, Any] = f({}, "env.kwargs the evals (and the warm start and its check) play with instead, "
                                       "over env.kwargs: e.g. {reward: math} measures by exact answers a run trained "
                                       "on a judge's reward.")


@dataclass
class LoggingConfig(Section):
    """What a run writes and shows."""

    tensorboard: bool = f(True, "Write TensorBoard events (needs the tensorboard package).")
    wandb: bool = f(False, "Log to Weights & Biases (pip install 'areal-agents[wandb]').")
    wandb_project: str = f("areal-agents", "W&B project name.")
    samples_per_step: int = f(4, "Sample trajectories written per step.")
    episodes: str = f("4", "Episode record (RUN_DIR/episodes/, docs/record.md): groups kept per training step "
                      "(and as many failed episodes), 'all', or 0 for none. The default env's run records about "
                      "294,000 bytes per 1,000 episodes at the default (103,000 with 'all'): 10,000 steps keep "
                      "about 94 MB.", Rule(lambda v: v == "all" or str(v).isdigit(), "'all' or a whole number >= 0"))
    plots: bool = f(True, "Write PNG plots at the end of a run.")
    progress: bool = f(True, "Show rich progress bars.")

    @property
    def episodes_kept(self) -> int | None:
        """``episodes`` as the recorder's ``keep``: None for all, else the groups per step."""
        return None if self.episodes == "all" else int(self.episodes)
