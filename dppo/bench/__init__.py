"""`dppo bench`: one module per benchmark; the helpers they share are public."""
