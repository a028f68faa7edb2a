"""The contract both halves speak: CR schemas, annotation codecs, resource names, extender types."""
