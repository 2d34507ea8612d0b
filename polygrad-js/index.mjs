// polygrad for Node.js as an ES module: import { Model } from 'polygrad'
import api from './index.js'

export const { Model, VERSION, simdSupported, PolygradError, BundleError, KernelError, ModelError, ModelInputError, EntrypointError } = api
export default api
