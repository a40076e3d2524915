"""kopf handlers: decorators only. Each parses what kopf hands over, calls the reconciler and
posts the events it returns; all decisions live in the pure packages."""
