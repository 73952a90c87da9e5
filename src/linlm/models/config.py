"""The earlier name of :mod:`linlm.models.model_config`, kept because user code imports ModelConfig from here."""
from linlm.models.model_config import *  # noqa: F401,F403
