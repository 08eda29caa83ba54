"""Check a Hugging Face Hub model id before a run loads it.

A Hub id that is neither in the local Hugging Face cache nor reachable would otherwise fail
deep inside transformers, after huggingface_hub's retries have printed a screenful of
warnings. :func:`check_hub_model` asks the Hub once for the model's ``config.json`` (one
request, no retries) and turns a failure into one line that names the config key, the Hub,
``HF_HUB_OFFLINE`` and the local-directory alternative.
"""

from __future__ import annotations

from areal_agents.config import ConfigError

__all__ = ["check_hub_model"]

_PROBE_TIMEOUT_S = 10.0


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0]}" if lines else type(exc).__name__


def check_hub_model(repo_id: str, key: str) -> None:
    """Raise :class:`ConfigError` (one line, naming ``key``) unless ``repo_id`` can be loaded:
    it is in the Hugging Face cache, or the Hub answers for its ``config.json``."""
    try:
        from huggingface_hub import constants, get_hf_file_metadata, hf_hub_url, try_to_load_from_cache
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError:  # transformers brings huggingface_hub; without it, the load reports itself
        return
    alternative = (f"download it where the Hub is reachable (`hf download {repo_id} --local-dir DIR`) and set "
                   f"{key}=DIR")
    try:
        cached = try_to_load_from_cache(repo_id, "config.json")
    except ValueError as exc:  # not a valid repo id, e.g. "a/b/c"
        raise ConfigError(key, f"{repo_id!r} is neither a model directory nor a Hub id ({exc})") from None
    if isinstance(cached, str):
        return  # in the cache: transformers loads it (set HF_HUB_OFFLINE=1 to skip its update check)
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(key, f"Hub id {repo_id} is not in the Hugging Face cache and HF_HUB_OFFLINE is set; "
                               f"unset it where the Hub is reachable, or {alternative}")
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=_PROBE_TIMEOUT_S)
    except HfHubHTTPError as exc:  # the Hub answered: no such model, gated, private
        raise ConfigError(key, f"the Hub ({constants.ENDPOINT}) refused Hub id {repo_id}: {_first_line(exc)}; "
                               f"check the id and your token, or {alternative}") from None
    except Exception as exc:  # noqa: BLE001 - DNS, refused connections, timeouts: the Hub is out of reach
        raise ConfigError(key, f"Hub id {repo_id}: cannot reach the Hub ({constants.ENDPOINT}: "
                               f"{_first_line(exc)}) and it is not in the Hugging Face cache; {alternative}, "
                               f"or put it in the cache and set HF_HUB_OFFLINE=1") from None
