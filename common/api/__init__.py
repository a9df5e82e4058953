"""The DataStream DSL users write jobs with (`dsl` gathers its classes: `environment`,
`streamreader`, `datastream`, `handles`, `arguments`), translated into a JobGraph (`translate`)."""
