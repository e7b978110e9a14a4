from .chat_template import ChatTemplate, parse_response
from .detokenizer import IncrementalDetokenizer
from .qwen_tokenizer import CheckpointTokenizer, get_tokenizer, tokenizer_for_checkpoint

__all__ = [
    "CheckpointTokenizer",
    "get_tokenizer",
    "tokenizer_for_checkpoint",
    "ChatTemplate",
    "parse_response",
    "IncrementalDetokenizer",
]
