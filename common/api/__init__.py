"""The DataStream DSL users write jobs with (`dsl`), translated into a JobGraph."""
