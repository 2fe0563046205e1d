"""Models shipped with parcae, written against the same public contract as a user's (`parcae.TrainSpec`): the
example GPTs (`gpt`, registered as "tiny-gpt" and "small-gpt"). Copyable examples of a user's own model live in the
repository's `examples/` folder."""
