module github.com/kvbm/kvbm

go 1.26

require (
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/ianlancetaylor/cgosymbolizer v0.0.0-20260504013507-f4b012c11129
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
