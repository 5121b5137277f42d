"""The HTTP routes, one APIRouter per API surface."""
