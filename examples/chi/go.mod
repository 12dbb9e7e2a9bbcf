module github.com/kilat-dev/ratelimit/examples/chi

go 1.26.0

replace github.com/kilat-dev/ratelimit => ../..

require (
	github.com/go-chi/chi/v5 v5.5.0
	github.com/kilat-dev/ratelimit v0.0.0-00010101000000-000000000000
	github.com/stretchr/testify v1.12.1
)

require go.yaml.in/yaml/v3 v3.0.5 // indirect
