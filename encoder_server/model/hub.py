"""Models named by Hugging Face id: the folder of one revision in the Hugging Face cache
(`HF_HUB_CACHE`, default ~/.cache/huggingface/hub), downloaded first when the network allows.

With HF_HUB_OFFLINE=1 nothing is downloaded, and a model missing from the cache is a one-line error.
"""
import os

from .model_folder import ConfigError


def download_model(repo_id, revision=None):
    """The local folder of `repo_id` at `revision` (default: main)."""
    where = f"{repo_id}" + (f" at revision {revision}" if revision else "")
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError
    except ImportError:
        raise ConfigError(f"--model {where}: not a folder, and a Hugging Face id needs huggingface_hub, which this "
                          "install lacks (pip install 'encoder-server[server]', or the container image's full "
                          "target)") from None
    try:
        return snapshot_download(repo_id, revision=revision)
    except HFValidationError:
        raise ConfigError(f"--model {repo_id}: neither a folder nor a valid Hugging Face id (ORG/NAME)") from None
    except LocalEntryNotFoundError:
        how = "HF_HUB_OFFLINE is set" if _offline() else "the Hugging Face Hub cannot be reached"
        raise ConfigError(f"--model {where}: not in the Hugging Face cache, and {how}; download it where the "
                          "network allows (huggingface-cli download), or pass a folder") from None
    except Exception as error:  # the hub's HTTP errors: unknown repository, revision, gated model
        first_line = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ConfigError(f"--model {where}: {first_line}") from None


def _offline():
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
