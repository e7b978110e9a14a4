"""Checks shared by the engine tests."""

from python_layer import InferenceEngine


def no_request_holds_pages(engine: InferenceEngine) -> bool:
    """Page accounting is exact, and every page is free or held by the prefix cache alone."""
    engine.scheduler.check_page_accounting()
    cached = engine.prefix_cache.num_cached_pages if engine.prefix_cache else 0
    return not engine.requests and engine.kv_cache.num_free_pages + cached == engine.kv_cache.num_usable_pages
