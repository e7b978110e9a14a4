# MILI on a CPU: the README's install in a container, run as a non-root user.
#   docker build -t mili .
#   docker run -p 8000:8000 -v /path/to/Qwen3-checkpoint:/model:ro mili
# The model is a mounted checkpoint directory (Hugging Face layout); without a mount at /model, pass --model or
# run `docker run -p 8000:8000 mili --model ""` for the built-in random-weight model. Extra arguments go to `mili serve`.
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    PATH=/home/mili/.venv/bin:$PATH

RUN useradd --create-home --uid 1000 mili
USER 1000
WORKDIR /home/mili/app
COPY --chown=mili:mili . .

# the README's install (the CPU build of PyTorch first), then the kernel package and extension module, so the
# first start only compiles the model graph (MAX's compile cache: .modular_cache/ here)
RUN python -m venv /home/mili/.venv \
    && pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu \
    && pip install -e . \
    && ./build.sh

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=5s --start-period=600s --retries=3 \
    CMD ["python", "-c", "import sys, urllib.request; sys.exit(urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4).status != 200)"]

ENTRYPOINT ["mili", "serve", "--host", "0.0.0.0", "--port", "8000"]
CMD ["--model", "/model"]
