"""The Cost of attention page: measured time and memory of attention variants against n."""
