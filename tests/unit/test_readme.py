"""The README's Python example runs as written (on the tiny checkpoint instead of a downloaded one)."""

import re
from pathlib import Path

README = Path(__file__).parents[2] / "README.md"


def test_readme_python_example_runs(tiny_checkpoint: Path, capsys) -> None:
    code = next(b for b in re.findall(r"```python\n(.*?)```", README.read_text(), re.S) if "InferenceEngine" in b)
    code = code.replace("~/models/Qwen3-0.6B", str(tiny_checkpoint)).replace("max_tokens=256", "max_tokens=8")
    namespace: dict = {}
    exec(compile(code, str(README), "exec"), namespace)
    assert len(namespace["outs"]) == 2 and all(o.finish_reason == "length" for o in namespace["outs"])
    assert isinstance(namespace["answer"], str)
