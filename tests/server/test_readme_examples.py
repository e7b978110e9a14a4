"""The README's curl and openai-client examples run as written, against a live server (its address and model
name put in place of http://127.0.0.1:8000 and mili-builtin)."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from tests.server.live_server import MODEL_NAME, LiveServer

README = (Path(__file__).parents[2] / "README.md").read_text()


def _adapt(text: str, server: LiveServer) -> str:
    return text.replace("http://127.0.0.1:8000", server.url).replace("mili-builtin", MODEL_NAME)


def test_readme_curl_examples(server: LiveServer) -> None:
    block = next(b for b in re.findall(r"```bash\n(.*?)```", README, re.S) if "curl" in b)
    commands = [c for c in block.replace("\\\n", " ").splitlines() if c.startswith("curl")]
    assert len(commands) == 3
    outputs = [subprocess.run(_adapt(c, server), shell=True, capture_output=True, text=True, check=True).stdout
               for c in commands]
    assert json.loads(outputs[0])["status"] == "healthy"
    assert len(json.loads(outputs[1])["tokens"]) >= 1
    assert outputs[2].rstrip().endswith("data: [DONE]") and '"chat.completion.chunk"' in outputs[2]


def test_readme_openai_example(server: LiveServer, capsys) -> None:
    code = next(b for b in re.findall(r"```python\n(.*?)```", README, re.S) if "OpenAI(" in b)
    exec(compile(_adapt(code, server), "README.md", "exec"), {})
    assert capsys.readouterr().out.strip()
