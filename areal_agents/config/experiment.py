"""The experiment config: every section in one :class:`ExperimentConfig`, with the rules that span sections."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from areal_agents.config.fields import Section, f, one_of
from areal_agents.config.reward_sections import JudgeConfig, RewardModelConfig
from areal_agents.config.sections import (
    ActorConfig,
    AgentConfig,
    AlgorithmConfig,
    DataConfig,
    EnvConfig,
    EvalConfig,
    InferenceConfig,
    LoggingConfig,
    OnlineConfig,
    RayConfig,
    RolloutConfig,
    SamplingConfig,
    SFTConfig,
    SGLangConfig,
    TrainerConfig,
)

__all__ = ["ExperimentConfig"]

@dataclass
class ExperimentConfig(Section):
    """One experiment: every section, loaded from YAML plus key=value overrides."""

    experiment_name: str | None = f(None, "Groups trials under runs/<experiment_name>/; None = the env's name.")
    trial_name: str = f("trial", "Output dir is runs/<experiment_name>/<trial_name>/.")
    output_dir: str = f("runs", "Root directory of run outputs.")
    mode: str = f("full", "full (rollout + train), online (train from sessions that agents outside the run open "
                          "through the gateway: docs/online.md), rollout (write JSONL) or train (from JSONL).",
                  one_of("full", "online", "rollout", "train"))
    train_data: str | None = f(None, "mode=train: rollout JSONL to train from.")
    seed: int = f(1, "Global seed.")
    imports: list[str] = f([], "Modules or .py files imported first, to register custom envs/agents/algorithms.")
    launcher: str = f("local", "Where servers and trainer ranks run: local processes or a Ray cluster "
                               "(pip install 'areal-agents[ray]').", one_of("local", "ray"))
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
    ray: RayConfig = field(default_factory=RayConfig)
    online: OnlineConfig = field(default_factory=OnlineConfig)
    judge: JudgeConfig = field(default_factory=JudgeConfig)
    reward_model: RewardModelConfig = field(default_factory=RewardModelConfig)

    def __post_init__(self) -> None:
        if self.experiment_name is None:
            self.experiment_name = self.env.name  # runs of different envs never share a run dir
        super().__post_init__()
        if self.algorithm.max_response_tokens is None:  # L_max of the overlong penalty
            self.algorithm.max_response_tokens = self.agent.max_tokens

    def rules(self) -> list[tuple[bool, str, str]]:
        rules = [(self.mode != "train" or self.train_data is not None, "train_data",
                  "mode=train needs train_data=<rollout JSONL>")]
        sync, backend, address = self.trainer.weight_sync, self.inference.backend, self.trainer.weight_sync_address
        loopback = ("127.0.0.1", "localhost", "::1", "[::1]")
        hosts = (a.rsplit(":", 1)[0].split("//")[-1] for a in self.inference.addresses)
        far = [h for h in hosts if h not in loopback] if sync != "disk" and backend == "remote" else []
        return rules + [
            (self.trainer.nproc % self.actor.hsdp_replicate == 0, "actor.hsdp_replicate",
             f"must divide trainer.nproc={self.trainer.nproc} (got {self.actor.hsdp_replicate})"),
            (not (sync == "gloo" and backend == "sglang"), "trainer.weight_sync",
             "gloo is for embedded servers; SGLang on GPUs takes nccl (or disk)"),
            (not (sync == "nccl" and backend == "embedded"), "trainer.weight_sync",
             "nccl needs SGLang servers on GPUs; embedded servers take gloo (or disk)"),
            (not (sync == "nccl" and self.actor.lora.rank > 0), "trainer.weight_sync",
             "LoRA adapters reach SGLang servers through disk (/load_lora_adapter): set trainer.weight_sync=disk"),
            (not far or address not in loopback, "trainer.weight_sync_address",
             f"servers on other hosts ({', '.join(far)}) cannot join a {sync} group at {address}: "
             "set this host's address"),
        ]

    @property
    def trainer_first_gpu(self) -> int:
        """GPU of trainer local rank 0: ``trainer.first_gpu``, else the first GPU after the
        ``num_servers × tp_size`` GPUs of the SGLang servers this run launches (they start at 0)."""
        if self.trainer.first_gpu is not None:
            return self.trainer.first_gpu
        return self.inference.num_servers * self.sglang.tp_size if self.inference.backend == "sglang" else 0

    @property
    def weights_dir(self) -> str:
        """Where disk weight sync writes versions: under ``ray.shared_dir`` when set, else the run dir."""
        root = self.ray.shared_dir or self.output_dir
        return os.path.join(root, self.experiment_name or self.env.name, self.trial_name, "weights")

    @property
    def run_dir(self) -> str:
        return os.path.join(self.output_dir, self.experiment_name or self.env.name, self.trial_name)
