"""encoder-server inside other engines: `integrations.ray` embeds Ray Data datasets."""
