package devtools.registry;

import io.apicurio.common.apps.config.DynamicConfigPropertyList;
import java.util.List;
import javax.enterprise.inject.Produces;
import javax.inject.Singleton;

/**
 * The bean that Apicurio's config-index extension would generate at build time (its deployment jar is not on
 * Maven Central here): the settings an admin may change while the registry runs. Empty: tests change none.
 */
public class DynamicPropertiesProducer {

    @Produces
    @Singleton
    DynamicConfigPropertyList dynamicConfigProperties() {
        return new DynamicConfigPropertyList(List.of());
    }
}
