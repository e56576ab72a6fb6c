"""The operator commands: `tritonnx-serve`, `tritonnx-models`, `make monitor`, `make traces`."""
