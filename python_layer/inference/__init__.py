from .inference_engine import InferenceEngine
from .request import InferenceRequest, RequestOutput, RequestStatus
from .sampler import BatchSampler
from .sampling_params import SamplingParams
from .scheduler import ContinuousBatchScheduler

__all__ = [
    "BatchSampler", "ContinuousBatchScheduler", "InferenceEngine", "InferenceRequest", "RequestOutput", "RequestStatus",
    "SamplingParams",
]
