from .chat_template import MessageFormatter, parse_response
from .detokenizer import IncrementalDetokenizer
from .qwen_tokenizer import QwenTokenizer, get_tokenizer, tokenizer_for_checkpoint

__all__ = ["QwenTokenizer", "get_tokenizer", "tokenizer_for_checkpoint", "MessageFormatter", "parse_response", "IncrementalDetokenizer"]
