"""Lifecycle decisions with money on them: keep, reset, RMA or repair, repurpose or retire each GPU."""
