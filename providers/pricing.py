"""Estimated dollars for model usage, from the price table in the config."""

from __future__ import annotations

from schemas.config import ModelPrice, PricingConfig


def token_cost(price: ModelPrice | None, *, prompt: int, output: int = 0, cached: int = 0) -> float:
    """Return the cost of a call's tokens; prompt counts include the cached ones, as Gemini reports them."""
    if price is None:
        return 0.0
    cached_rate = price.input if price.cached_input is None else price.cached_input
    return ((prompt - cached) * price.input + cached * cached_rate + output * price.output) / 1_000_000


def model_cost(pricing: PricingConfig, model: str, *, prompt: int, output: int = 0, cached: int = 0,
               batch: bool = False) -> float:
    """Return the estimated cost of a model's usage, at the batch discount when it ran in Batch Mode."""
    cost = token_cost(pricing.models.get(model), prompt=prompt, output=output, cached=cached)
    return cost * pricing.batch_discount if batch else cost
