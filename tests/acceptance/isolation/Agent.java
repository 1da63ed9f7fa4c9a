// Java's HttpClient: proxies only through system properties, no proxy credentials unasked.
import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;

public class Agent {
    public static void main(String[] args) throws Exception {
        HttpRequest request = HttpRequest.newBuilder(URI.create("https://api.things.test/repos/iso/lab/things"))
            .header("Content-Type", "application/json")
            .POST(HttpRequest.BodyPublishers.ofString("{\"name\": \"" + args[0] + "\"}"))
            .build();
        HttpResponse<String> answer = HttpClient.newHttpClient().send(request, HttpResponse.BodyHandlers.ofString());
        System.out.println("java " + answer.statusCode() + " " + answer.headers().firstValue("x-sidecar-effect").orElse("-"));
    }
}
