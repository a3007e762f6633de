"""The worker side: the job pipeline SDK and the built-in worker packs."""
