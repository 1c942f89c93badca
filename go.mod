module github.com/kvbm/kvbm

go 1.26

require (
	github.com/stretchr/testify v1.12.1
	go.uber.org/goleak v1.3.0
)

require (
	github.com/ianlancetaylor/cgosymbolizer v0.0.0-20260504013507-f4b012c11129 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
)
