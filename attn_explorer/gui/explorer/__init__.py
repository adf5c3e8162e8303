"""The explorer's pages and side panels: grid, one head, token focus, patch overlay, input, d_k and n."""
