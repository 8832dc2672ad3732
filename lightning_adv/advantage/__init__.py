"""The advantage pipeline: :class:`~lightning_adv.advantage.module.AdvantageModule` runs the
design note's order (length penalty, outcome shaping, reward normalization, alignment and
the temporal estimator, advantage normalization, process shaping) over the steps of this
package: alignment to the next-token convention, reward terms, normalization, multi-column
rewards and the exclusion of unscorable rows."""
