from .inference_engine import InferenceEngine
from .request import InferenceRequest, RequestOutput, RequestStatus
from .sampler import Sampler
from .sampling_params import SamplingParams

__all__ = ["InferenceEngine", "InferenceRequest", "RequestOutput", "RequestStatus", "Sampler", "SamplingParams"]
