"""The Generate page: next-token bars and each new token's attention, for decoders."""
