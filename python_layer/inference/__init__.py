from .inference_engine import InferenceEngine
from .request import InferenceRequest, RequestMetadata, RequestOutput, RequestPhase, RequestStatus
from .sampler import Sampler
from .sampling_params import SamplingParams
from .scheduler import ContinuousBatchScheduler

__all__ = [
    "ContinuousBatchScheduler", "InferenceEngine", "InferenceRequest", "RequestMetadata", "RequestOutput", "RequestPhase",
    "RequestStatus", "Sampler", "SamplingParams",
]
