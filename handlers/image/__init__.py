"""Image models: decoding and checking the images a request carries, and the kinds that compute on them."""
