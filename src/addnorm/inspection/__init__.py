"""Seeing inside a model while it trains: per-layer gradient norms and update sizes, the
residual stream's scale around every norm, what each norm divides out (BatchNorm: its batch's
own effect and its running statistics' lag apart), attention entropy per head and the FFN
units whose output stays near zero (:mod:`~addnorm.inspection.watcher`, ``addnorm.watch``),
for any model built of addnorm's parts (:mod:`~addnorm.inspection.model_map`); its records
drawn (:mod:`~addnorm.inspection.figure`) and told in sentences
(:mod:`~addnorm.inspection.summary`)."""

from addnorm.inspection.model_map import ModelMap
from addnorm.inspection.watcher import Watch, watch

__all__ = ["ModelMap", "Watch", "watch"]
